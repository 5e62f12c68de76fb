"""What can be done to webhooks: register a receiver (its URL checked), list receivers,
rotate a secret, re-enable a receiver, read deliveries and send one again now."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Protocol

from inferq.domain.webhooks import (
    Delivery,
    DeliveryState,
    WebhookEndpoint,
    WebhookFormat,
    WebhookRequest,
    check_webhook_url,
    parse_networks,
)
from inferq.exceptions import BrokerUnavailable, InvalidRequest
from inferq.store.base import Page
from inferq.store.webhooks import WebhookStore


class WebhookNudge(Protocol):
    """Who is told that deliveries are due now (`JobPublisher`)."""

    def publish_webhooks(self) -> None: ...


class WebhookOperations:
    def __init__(
        self,
        *,
        store: WebhookStore,
        publisher: WebhookNudge,
        allowed_networks: Sequence[str],
        secret_overlap_s: int,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._allowed = parse_networks(list(allowed_networks))
        self._secret_overlap_s = secret_overlap_s

    def request(self, url: str | None, events: Sequence[str] | None) -> WebhookRequest | None:
        """The webhook a job or batch asked for, its URL checked (SSRF), or None. Checking
        a URL may resolve its host name."""
        if url is None:
            if events is not None:
                raise InvalidRequest("webhook_events needs a webhook_url", param="webhook_events")
            return None
        check_webhook_url(url, allowed=self._allowed)
        return WebhookRequest(url=url, events=None if events is None else list(events))

    def register(
        self, *, tenant: str, url: str, format_: WebhookFormat | None = None
    ) -> WebhookEndpoint:
        """The tenant's receiver at `url`, registered if new; with `format_`, the shape
        of its events from now on (a new one's is inferq's unless given)."""
        self.request(url, None)
        return self._store.register(tenant=tenant, url=url, format_=format_)

    def endpoints(self, *, scope: str | None) -> list[WebhookEndpoint]:
        return self._store.endpoints(scope=scope)

    def rotate(self, endpoint_id: str, *, scope: str | None) -> WebhookEndpoint:
        return self._store.rotate(endpoint_id, scope=scope, overlap_s=self._secret_overlap_s)

    def enable(self, endpoint_id: str, *, scope: str | None) -> list[WebhookEndpoint]:
        """Enable a receiver that was disabled; all of the tenant's receivers."""
        self._store.set_enabled(endpoint_id, scope=scope, reason=None)
        return self._store.endpoints(scope=scope)

    def get(self, delivery_id: str, *, scope: str | None) -> Delivery:
        return self._store.get(delivery_id, scope=scope)

    def page(
        self,
        *,
        scope: str | None,
        job_id: str | None,
        batch_id: str | None,
        state: DeliveryState | None,
        after: str | None,
        limit: int,
    ) -> Page[Delivery]:
        return self._store.page(
            scope=scope, job_id=job_id, batch_id=batch_id, state=state, after=after, limit=limit
        )

    def replay(self, delivery_id: str, *, scope: str | None) -> Delivery:
        """Send a delivery again now, with the same `webhook-id`."""
        delivery = self._store.replay(delivery_id, scope=scope)
        with contextlib.suppress(BrokerUnavailable):  # maintenance finds it due anyway
            self._publisher.publish_webhooks()
        return delivery
