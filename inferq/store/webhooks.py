"""Webhook endpoints, deliveries and the attempts made.

The delivery loop claims due deliveries under a lease, so a worker that dies
mid-attempt leaves the delivery to be tried again. (Deliveries are written by the
transactions that end jobs and batches: see `inferq.store.outbox`.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, exists, select
from sqlalchemy.orm import Session

from inferq.domain.webhooks import (
    ACTIVE_DELIVERY_STATES,
    Attempt,
    Delivery,
    DeliveryState,
    WebhookEndpoint,
    WebhookFormat,
    new_secret,
)
from inferq.exceptions import InvalidState
from inferq.store.base import Page, Store, as_utc, newest_first, scoped_row
from inferq.store.models import WebhookAttemptRow, WebhookDeliveryRow, WebhookEndpointRow
from inferq.store.outbox import ensure_endpoint

LOST_ATTEMPT = "the delivering worker stopped before this attempt ended"
_ENDPOINT = "webhook endpoint"
_DELIVERY = "webhook delivery"


class WebhookStore(Store):
    # Endpoints.

    def register(
        self, *, tenant: str, url: str, format_: WebhookFormat | None = None
    ) -> WebhookEndpoint:
        """`tenant`'s endpoint for `url`, made if need be; with `format_`, its events'
        shape from now on."""
        with self._transaction() as session:
            endpoint_id = ensure_endpoint(session, tenant=tenant, url=url, now=self._clock())
            row = scoped_row(session, WebhookEndpointRow, endpoint_id, tenant, noun=_ENDPOINT)
            if format_ is not None:
                row.format = format_.value
            return _endpoint(row)

    def endpoints(self, *, scope: str | None) -> list[WebhookEndpoint]:
        query = select(WebhookEndpointRow).order_by(WebhookEndpointRow.id)
        if scope is not None:
            query = query.where(WebhookEndpointRow.tenant == scope)
        with self._transaction() as session:
            return [_endpoint(row) for row in session.scalars(query)]

    def rotate(self, endpoint_id: str, *, scope: str | None, overlap_s: int) -> WebhookEndpoint:
        """A new secret; the old one still signs (beside it) for `overlap_s` seconds."""
        now = self._clock()
        with self._transaction() as session:
            row = scoped_row(
                session, WebhookEndpointRow, endpoint_id, scope, noun=_ENDPOINT, for_update=True
            )
            row.previous_secret, row.secret = row.secret, new_secret()
            row.previous_expires_at = now + timedelta(seconds=overlap_s)
            return _endpoint(row)

    def set_enabled(self, endpoint_id: str, *, scope: str | None, reason: str | None) -> None:
        """Enable an endpoint (`reason` None) or disable it with `reason`."""
        with self._transaction() as session:
            row = scoped_row(
                session, WebhookEndpointRow, endpoint_id, scope, noun=_ENDPOINT, for_update=True
            )
            row.disabled_at = None if reason is None else self._clock()
            row.disabled_reason = reason

    # Deliveries.

    def claim_due(self, *, limit: int, lease_s: float) -> list[tuple[Delivery, WebhookEndpoint]]:
        """Take up to `limit` due deliveries (pending, or delivering under a lapsed lease)
        for one attempt each. Deliveries to a disabled endpoint end as disabled."""
        now = self._clock()
        claimed: list[tuple[Delivery, WebhookEndpoint]] = []
        with self._transaction() as session:
            rows = session.scalars(
                select(WebhookDeliveryRow)
                .where(_due(now))
                .order_by(WebhookDeliveryRow.next_attempt_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            ).all()
            endpoints = _endpoints_of(session, {row.endpoint_id for row in rows})
            for row in rows:
                if row.state == DeliveryState.DELIVERING.value:
                    session.add(_attempt(row.id, row.attempts, row.next_attempt_at, LOST_ATTEMPT))
                endpoint = endpoints[row.endpoint_id]
                if endpoint.disabled_at is not None:
                    row.state, row.finished_at = DeliveryState.DISABLED.value, now
                    continue
                row.state = DeliveryState.DELIVERING.value
                row.attempts += 1
                row.next_attempt_at = now + timedelta(seconds=lease_s)
                claimed.append((_delivery(row, endpoint.url), endpoint))
        return claimed

    def record(
        self,
        delivery: Delivery,
        attempt: Attempt,
        *,
        retry_in_s: float | None,
        disable_endpoint: str | None = None,
    ) -> DeliveryState:
        """Record one attempt and what follows: success (2xx), another try in
        `retry_in_s`, dead-lettered (no retry left), or a disabled endpoint (410)."""
        now = self._clock()
        with self._transaction() as session:
            session.add(
                WebhookAttemptRow(
                    delivery_id=delivery.id,
                    number=attempt.number,
                    started_at=attempt.started_at,
                    status_code=attempt.status_code,
                    latency_ms=attempt.latency_ms,
                    error=attempt.error,
                )
            )
            row = session.get(WebhookDeliveryRow, delivery.id, with_for_update=True)
            assert row is not None
            if row.state != DeliveryState.DELIVERING.value or row.attempts != attempt.number:
                return DeliveryState(row.state)  # replayed or taken over meanwhile
            succeeded = attempt.status_code is not None and 200 <= attempt.status_code < 300
            if succeeded:
                state = DeliveryState.SUCCEEDED
            elif disable_endpoint is not None:
                state = DeliveryState.DISABLED
                endpoint = session.get(WebhookEndpointRow, delivery.endpoint_id)
                assert endpoint is not None
                endpoint.disabled_at, endpoint.disabled_reason = now, disable_endpoint
            elif retry_in_s is None:
                state = DeliveryState.DEAD
            else:
                state = DeliveryState.PENDING
                row.next_attempt_at = now + timedelta(seconds=retry_in_s)
            row.state = state.value
            if state is not DeliveryState.PENDING:
                row.finished_at = now
            return state

    def due(self) -> bool:
        """Whether any delivery is due now (for maintenance to start the delivery loop)."""
        with self._transaction() as session:
            return bool(session.scalar(select(exists().where(_due(self._clock())))))

    def get(self, delivery_id: str, *, scope: str | None) -> Delivery:
        with self._transaction() as session:
            row = scoped_row(session, WebhookDeliveryRow, delivery_id, scope, noun=_DELIVERY)
            return _deliveries_with_history(session, [row])[0]

    def page(
        self,
        *,
        scope: str | None,
        job_id: str | None = None,
        batch_id: str | None = None,
        state: DeliveryState | None = None,
        after: str | None = None,
        limit: int = 20,
    ) -> Page[Delivery]:
        """Deliveries, newest first, with every attempt."""
        query = select(WebhookDeliveryRow)
        filters = {
            WebhookDeliveryRow.tenant: scope,
            WebhookDeliveryRow.job_id: job_id,
            WebhookDeliveryRow.batch_id: batch_id,
            WebhookDeliveryRow.state: state.value if state else None,
        }
        for column, value in filters.items():
            if value is not None:
                query = query.where(column == value)
        with self._transaction() as session:
            return newest_first(
                session,
                query,
                WebhookDeliveryRow.id,
                after=after,
                limit=limit,
                convert=lambda rows: _deliveries_with_history(session, rows),
            )

    def replay(self, delivery_id: str, *, scope: str | None) -> Delivery:
        """Send a delivery again now (same `webhook-id`); its endpoint must be enabled."""
        now = self._clock()
        with self._transaction() as session:
            row = scoped_row(
                session, WebhookDeliveryRow, delivery_id, scope, noun=_DELIVERY, for_update=True
            )
            if row.state == DeliveryState.DELIVERING.value:
                raise InvalidState(f"delivery {delivery_id} is being delivered right now")
            endpoint = session.get(WebhookEndpointRow, row.endpoint_id)
            assert endpoint is not None
            if endpoint.disabled_at is not None:
                raise InvalidState(
                    f"its endpoint {endpoint.id} is disabled ({endpoint.disabled_reason}): "
                    f"enable it first (POST /v1/webhook-endpoints/{endpoint.id}/enable)"
                )
            row.state, row.next_attempt_at, row.finished_at = DeliveryState.PENDING.value, now, None
            return _deliveries_with_history(session, [row])[0]


def _due(now: datetime) -> ColumnElement[bool]:
    """Pending deliveries whose time has come, and deliveries whose sender's lease lapsed."""
    return and_(
        WebhookDeliveryRow.state.in_([s.value for s in ACTIVE_DELIVERY_STATES]),
        WebhookDeliveryRow.next_attempt_at <= now,
    )


def _attempt(delivery_id: str, number: int, started_at: datetime, error: str) -> WebhookAttemptRow:
    return WebhookAttemptRow(
        delivery_id=delivery_id, number=number, started_at=started_at, error=error
    )


def _endpoints_of(session: Session, ids: set[str]) -> dict[str, WebhookEndpoint]:
    if not ids:
        return {}
    rows = session.scalars(select(WebhookEndpointRow).where(WebhookEndpointRow.id.in_(ids)))
    return {row.id: _endpoint(row) for row in rows}


def _deliveries_with_history(
    session: Session, rows: Sequence[WebhookDeliveryRow]
) -> list[Delivery]:
    ids = [row.id for row in rows]
    history: dict[str, list[Attempt]] = {i: [] for i in ids}
    if ids:
        for a in session.scalars(
            select(WebhookAttemptRow)
            .where(WebhookAttemptRow.delivery_id.in_(ids))
            .order_by(WebhookAttemptRow.delivery_id, WebhookAttemptRow.number)
        ):
            history[a.delivery_id].append(
                Attempt(
                    number=a.number,
                    started_at=as_utc(a.started_at),
                    status_code=a.status_code,
                    latency_ms=a.latency_ms,
                    error=a.error,
                )
            )
    urls = {e.id: e.url for e in _endpoints_of(session, {row.endpoint_id for row in rows}).values()}
    return [
        replace(_delivery(row, urls[row.endpoint_id]), history=tuple(history[row.id]))
        for row in rows
    ]


def _endpoint(row: WebhookEndpointRow) -> WebhookEndpoint:
    return WebhookEndpoint(
        id=row.id,
        tenant=row.tenant,
        url=row.url,
        secret=row.secret,
        previous_secret=row.previous_secret,
        previous_expires_at=as_utc(row.previous_expires_at),
        created_at=as_utc(row.created_at),
        disabled_at=as_utc(row.disabled_at),
        disabled_reason=row.disabled_reason,
        format=WebhookFormat(row.format),
    )


def _delivery(row: WebhookDeliveryRow, url: str) -> Delivery:
    return Delivery(
        id=row.id,
        tenant=row.tenant,
        endpoint_id=row.endpoint_id,
        url=url,
        event=row.event,
        job_id=row.job_id,
        batch_id=row.batch_id,
        state=DeliveryState(row.state),
        attempts=row.attempts,
        next_attempt_at=as_utc(row.next_attempt_at),
        created_at=as_utc(row.created_at),
        finished_at=as_utc(row.finished_at),
    )
