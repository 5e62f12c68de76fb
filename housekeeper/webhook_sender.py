"""Sending webhooks: claim due deliveries, sign, POST to the checked address, record.

Only a 2xx is a success. `410 Gone` disables the endpoint. Anything else (another status,
a timeout, a refused connection, a redirect) is a failed attempt, tried again on the
schedule (or later, if the receiver sent `Retry-After`) until it is used up and the
delivery is dead-lettered. The URL is checked again before every attempt, and the
connection goes to the address that was checked; redirects are never followed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

import httpx

from inferq.domain.webhooks import (
    Attempt,
    Delivery,
    DeliveryState,
    Network,
    UnsafeWebhookUrl,
    WebhookEndpoint,
    WebhookFormat,
    check_webhook_url,
    event_payload,
    next_delay_s,
    openai_event,
    retry_after_s,
    sign,
)
from inferq.store.base import utcnow
from inferq.store.webhooks import WebhookStore

log = logging.getLogger(__name__)

CLAIM_LIMIT = 64
USER_AGENT = "inferq-webhooks/1"
# What a receiver said, kept with the attempt (enough to see why it failed).
ERROR_BODY_CHARS = 200

Render = Callable[[Delivery], dict[str, Any]]


class WebhookSender:
    def __init__(
        self,
        *,
        store: WebhookStore,
        render: Render,
        timeout_s: float,
        schedule_s: Sequence[float],
        allowed: Sequence[Network],
        concurrency: int,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store = store
        self._render = render
        self._timeout_s = timeout_s
        self._schedule_s = schedule_s
        self._allowed = allowed
        self._clock = clock
        self._pool = ThreadPoolExecutor(concurrency, thread_name_prefix="webhook")
        self._client = httpx.Client(
            timeout=timeout_s, follow_redirects=False, headers={"user-agent": USER_AGENT}
        )

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._client.close()

    def deliver_due(self) -> dict[str, int]:
        """Attempt every due delivery once; return how many ended in each state."""
        outcomes: dict[str, int] = {}
        while True:
            # The lease outlasts one attempt, so nobody else takes it while it runs.
            claimed = self._store.claim_due(limit=CLAIM_LIMIT, lease_s=2 * self._timeout_s + 5)
            if not claimed:
                return outcomes
            for state in self._pool.map(lambda pair: self.attempt(*pair), claimed):
                outcomes[state.value] = outcomes.get(state.value, 0) + 1

    def _payload(
        self, delivery: Delivery, endpoint: WebhookEndpoint, now: datetime
    ) -> dict[str, Any]:
        """The event in the endpoint's format (a job's event is always inferq's)."""
        if endpoint.format is WebhookFormat.OPENAI and (event := openai_event(delivery)):
            return event
        return event_payload(delivery.event, self._render(delivery), now)

    def attempt(self, delivery: Delivery, endpoint: WebhookEndpoint) -> DeliveryState:
        started_at = self._clock()
        started = time.monotonic()
        status_code: int | None = None
        error: str | None = None
        retry_after: float | None = None
        try:
            target = check_webhook_url(endpoint.url, allowed=self._allowed)
            body = json.dumps(self._payload(delivery, endpoint, started_at), separators=(",", ":"))
            response = self._client.post(
                target.pinned_url(),
                content=body.encode(),
                headers={
                    "host": target.host_header(),
                    "content-type": "application/json",
                    "webhook-id": delivery.id,
                    "webhook-timestamp": str(int(started_at.timestamp())),
                    "webhook-signature": sign(
                        endpoint.signing_secrets(started_at),
                        msg_id=delivery.id,
                        timestamp=started_at,
                        body=body,
                    ),
                },
                extensions={"sni_hostname": target.host},
            )
            status_code = response.status_code
            if not response.is_success:
                error = f"HTTP {status_code}: {response.text[:ERROR_BODY_CHARS]}"
                retry_after = retry_after_s(response.headers.get("retry-after"), started_at)
        except UnsafeWebhookUrl as exc:
            error = exc.message
        except httpx.TimeoutException:
            error = f"no answer within {self._timeout_s:g} s"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"
        attempt = Attempt(
            number=delivery.attempts,
            started_at=started_at,
            status_code=status_code,
            latency_ms=round((time.monotonic() - started) * 1000),
            error=error,
        )
        gone = "the receiver answered 410 Gone" if status_code == 410 else None
        state = self._store.record(
            delivery,
            attempt,
            retry_in_s=None
            if gone
            else next_delay_s(delivery.attempts, self._schedule_s, retry_after_s=retry_after),
            disable_endpoint=gone,
        )
        log.info(
            "webhook %s %s to %s: attempt %d %s",
            delivery.id,
            delivery.event,
            endpoint.url,
            attempt.number,
            state.value if error is None else f"{state.value} ({error})",
            extra={"job_id": delivery.job_id, "batch_id": delivery.batch_id},
        )
        return state
