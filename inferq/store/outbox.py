"""The webhook outbox: delivery rows written inside the transaction that ends a job or a
batch, so a committed result always has its delivery and an uncommitted one never does; and
`OutboxStore`, the base of the stores whose transactions do that (jobs, batches)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from inferq.domain.webhooks import DeliveryState, new_secret, wants
from inferq.ids import new_id
from inferq.store.base import Store, utcnow
from inferq.store.dialects import conflict_insert, on_postgres
from inferq.store.models import JobRow, WebhookDeliveryRow, WebhookEndpointRow

log = logging.getLogger(__name__)


class OutboxStore(Store):
    """A store whose transactions end jobs or batches, and so may queue deliveries."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        clock: Callable[[], datetime] = utcnow,
        on_webhooks: Callable[[], None] | None = None,
        keep_connections: bool = False,
    ) -> None:
        """`on_webhooks` is called after a commit that queued webhook deliveries (to wake
        the housekeeper); if it fails, maintenance finds them anyway."""
        super().__init__(sessions, clock=clock, keep_connections=keep_connections)
        self._on_webhooks = on_webhooks

    def _wake_delivery(self, queued: int) -> None:
        """After a commit that queued `queued` deliveries, wake the housekeeper. If
        that fails, nothing is lost: maintenance finds due deliveries in Postgres."""
        if not queued or self._on_webhooks is None:
            return
        try:
            self._on_webhooks()
        except Exception:
            log.warning("could not wake the housekeeper for webhook deliveries", exc_info=True)


ENDPOINT_ID_PREFIX = "whe_"
DELIVERY_ID_PREFIX = "msg_"


def ensure_endpoint(session: Session, *, tenant: str, url: str, now: datetime) -> str:
    """The id of `tenant`'s endpoint for `url`, made (with a new secret) if need be."""
    session.execute(
        conflict_insert(WebhookEndpointRow, postgres=on_postgres(session))
        .values(
            id=new_id(ENDPOINT_ID_PREFIX),
            tenant=tenant,
            url=url,
            secret=new_secret(),
            created_at=now,
        )
        .on_conflict_do_nothing(index_elements=["tenant", "url"])
    )
    endpoint_id = session.scalar(
        select(WebhookEndpointRow.id).where(
            WebhookEndpointRow.tenant == tenant, WebhookEndpointRow.url == url
        )
    )
    assert endpoint_id is not None
    return endpoint_id


@dataclass(frozen=True)
class EndedJob:
    """What the outbox needs of a job that just ended."""

    id: str
    tenant: str
    status: str
    webhook_endpoint_id: str | None
    webhook_events: list[str] | None


def enqueue_job_events(session: Session, rows: Sequence[EndedJob | JobRow], now: datetime) -> int:
    """Delivery rows for jobs that just ended; jobs without a webhook are skipped."""
    values = [
        _delivery_values(
            tenant=row.tenant,
            endpoint_id=row.webhook_endpoint_id,
            event=f"job.{row.status}",
            job_id=row.id,
            batch_id=None,
            now=now,
        )
        for row in rows
        if row.webhook_endpoint_id is not None and wants(row.webhook_events, f"job.{row.status}")
    ]
    if values:
        session.execute(insert(WebhookDeliveryRow), values)
    return len(values)


def enqueue_batch_event(session: Session, row: Any, now: datetime) -> int:
    """A delivery row for a batch that just reached a final status (`row` is its row)."""
    event = f"batch.{row.status}"
    if row.webhook_endpoint_id is None or not wants(row.webhook_events, event):
        return 0
    session.execute(
        insert(WebhookDeliveryRow).values(
            **_delivery_values(
                tenant=row.tenant,
                endpoint_id=row.webhook_endpoint_id,
                event=event,
                job_id=None,
                batch_id=row.id,
                now=now,
            )
        )
    )
    return 1


def _delivery_values(
    *,
    tenant: str,
    endpoint_id: str,
    event: str,
    job_id: str | None,
    batch_id: str | None,
    now: datetime,
) -> dict[str, Any]:
    return {
        "id": new_id(DELIVERY_ID_PREFIX),
        "tenant": tenant,
        "endpoint_id": endpoint_id,
        "event": event,
        "job_id": job_id,
        "batch_id": batch_id,
        "state": DeliveryState.PENDING.value,
        "attempts": 0,
        "next_attempt_at": now,
        "created_at": now,
    }
