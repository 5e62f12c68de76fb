"""Webhooks: the events, the retry schedule, Standard Webhooks signing, and the guard
that keeps deliveries away from private networks (SSRF)."""

from __future__ import annotations

import base64
import ipaddress
import random
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from standardwebhooks import Webhook

from inferq.exceptions import InvalidRequest

SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
JITTER = 0.1


class DeliveryState(StrEnum):
    PENDING = "pending"  # waiting for its next attempt
    DELIVERING = "delivering"  # an attempt is under way (under a lease)
    SUCCEEDED = "succeeded"
    DEAD = "dead"  # every attempt failed: dead-lettered
    DISABLED = "disabled"  # its endpoint answered 410 Gone, or was disabled


ACTIVE_DELIVERY_STATES = (DeliveryState.PENDING, DeliveryState.DELIVERING)


class WebhookFormat(StrEnum):
    """The shape of the events an endpoint receives (both signed the same way)."""

    INFERQ = "inferq"
    """`type`, `timestamp` and `data`: the job or batch as the API shows it."""
    OPENAI = "openai"
    """OpenAI's events for batches (`id`, `object`, `type`, `created_at`, `data.id`), as
    `openai`'s `client.webhooks.unwrap` parses them; job events stay inferq's."""


@dataclass(frozen=True)
class WebhookRequest:
    """Where a job's or batch's events go, and which (None: every event of its kind)."""

    url: str
    events: list[str] | None = None


@dataclass(frozen=True, kw_only=True)
class WebhookEndpoint:
    id: str
    tenant: str
    url: str
    secret: str
    previous_secret: str | None
    previous_expires_at: datetime | None
    created_at: datetime
    disabled_at: datetime | None
    disabled_reason: str | None
    format: WebhookFormat = WebhookFormat.INFERQ

    def signing_secrets(self, now: datetime) -> list[str]:
        """The secret, and during a rotation's overlap the previous one too."""
        live = [self.secret]
        if self.previous_secret and self.previous_expires_at and now < self.previous_expires_at:
            live.append(self.previous_secret)
        return live


@dataclass(frozen=True, kw_only=True)
class Attempt:
    number: int
    started_at: datetime
    status_code: int | None
    latency_ms: int | None
    error: str | None


@dataclass(frozen=True, kw_only=True)
class Delivery:
    id: str  # also the `webhook-id` header: the same on every attempt
    tenant: str
    endpoint_id: str
    url: str
    event: str
    job_id: str | None
    batch_id: str | None
    state: DeliveryState
    attempts: int
    next_attempt_at: datetime
    created_at: datetime
    finished_at: datetime | None
    history: tuple[Attempt, ...] = field(default=())


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def sign(signing_secrets: Sequence[str], *, msg_id: str, timestamp: datetime, body: str) -> str:
    """The `webhook-signature` header: one `v1,<base64>` per live secret."""
    return " ".join(Webhook(s).sign(msg_id, timestamp, body) for s in signing_secrets)


def wants(events: Sequence[str] | None, event: str) -> bool:
    return events is None or event in events


def next_delay_s(
    attempts_made: int,
    schedule: Sequence[float],
    *,
    retry_after_s: float | None = None,
    rand: Callable[[], float] = random.random,
) -> float | None:
    """Seconds until the next attempt after `attempts_made` attempts, or None when the
    schedule is used up (dead-letter). A receiver's `Retry-After` pushes it later."""
    if attempts_made >= len(schedule):
        return None
    delay = schedule[attempts_made] * (1 + JITTER * (2 * rand() - 1))
    if retry_after_s is not None:
        delay = max(delay, retry_after_s)
    return delay


def retry_after_s(value: str | None, now: datetime) -> float | None:
    """A `Retry-After` header (seconds, or an HTTP date) as seconds from `now`."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def event_payload(event: str, data: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The body: Standard Webhooks' recommended `type`, `timestamp`, `data`."""
    return {"type": event, "timestamp": now.isoformat().replace("+00:00", "Z"), "data": data}


def openai_event(delivery: Delivery) -> dict[str, Any] | None:
    """A batch's event in OpenAI's shape (its id the delivery's, the same on every
    attempt); None for an event OpenAI has no shape for (a job's)."""
    if delivery.batch_id is None:
        return None
    return {
        "id": delivery.id,
        "object": "event",
        "type": delivery.event,
        "created_at": int(delivery.created_at.timestamp()),
        "data": {"id": delivery.batch_id},
    }


# --- SSRF guard ----------------------------------------------------------------------

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], list[str]]


class UnsafeWebhookUrl(InvalidRequest):
    """A webhook URL inferq will not call."""


@dataclass(frozen=True)
class Target:
    """A checked URL and the address it resolved to: the connection goes there."""

    url: str
    host: str
    address: Address

    def pinned_url(self) -> str:
        """The URL with its host replaced by the checked address (no second lookup)."""
        parts = urlsplit(self.url)
        ip = f"[{self.address}]" if self.address.version == 6 else str(self.address)
        netloc = f"{ip}:{parts.port}" if parts.port else ip
        return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))

    def host_header(self) -> str:
        parts = urlsplit(self.url)
        return parts.netloc.rsplit("@", 1)[-1]


def resolve(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def check_webhook_url(
    url: str, *, allowed: Sequence[Network] = (), resolver: Resolver = resolve
) -> Target:
    """Refuse (`UnsafeWebhookUrl`, a 422) a URL that is not http(s), or whose host resolves
    to any address that is not public, unless that address is in `allowed`."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise _refuse(url, f"it is not a valid URL ({exc})") from exc
    if parts.scheme not in ("http", "https"):
        raise _refuse(url, "only http and https URLs are allowed")
    host = parts.hostname
    if not host:
        raise _refuse(url, "it has no host")
    try:
        addresses = [ipaddress.ip_address(a.split("%", 1)[0]) for a in resolver(host, port)]
    except (OSError, UnicodeError) as exc:
        raise _refuse(url, f"its host {host!r} does not resolve ({exc})") from exc
    if not addresses:
        raise _refuse(url, f"its host {host!r} does not resolve")
    for address in addresses:
        if any(address in network for network in allowed):
            continue
        reason = forbidden_reason(address)
        if reason is not None:
            raise _refuse(
                url,
                f"{host!r} resolves to {address}, a {reason} address; webhooks go to public "
                "addresses only (an operator can allow private networks with "
                "INFERQ_WEBHOOK_ALLOWED_NETWORKS)",
            )
    return Target(url=url, host=host, address=addresses[0])


def forbidden_reason(address: Address) -> str | None:
    """Why `address` is not a public one, or None if it is."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour or _teredo_client(address)
        if embedded is not None:
            inner = forbidden_reason(embedded)
            return f"IPv4-embedding IPv6 ({inner})" if inner else None
    checks = (
        ("loopback", address.is_loopback),
        ("unspecified", address.is_unspecified),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("reserved", address.is_reserved),
        ("private", address.is_private),
        ("non-public", not address.is_global),
    )
    return next((name for name, hit in checks if hit), None)


def _teredo_client(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    teredo = address.teredo
    return teredo[1] if teredo else None


def parse_networks(values: Sequence[str]) -> list[Network]:
    return [ipaddress.ip_network(v.strip(), strict=False) for v in values if v.strip()]


def _refuse(url: str, why: str) -> UnsafeWebhookUrl:
    return UnsafeWebhookUrl(
        f"webhook_url {url!r} is refused: {why}", param="webhook_url", code="unsafe_webhook_url"
    )
