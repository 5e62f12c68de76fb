"""What can be done with usage and quotas: read a tenant's usage in buckets (an admin reads
any tenant's, or all at once), see where a key stands against its quota, and, for admins,
list API keys and set their limits."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from inferq.domain.api_keys import ApiKey, Principal
from inferq.domain.usage import (
    BUCKET_SECONDS,
    DEFAULT_BUCKETS,
    MAX_BUCKETS,
    BucketWidth,
    GroupBy,
    QuotaState,
    UsageBucket,
    bucket_starts,
    bucketed,
)
from inferq.exceptions import Forbidden, InvalidRequest, NotFound
from inferq.store.api_keys import KeyStore
from inferq.store.base import utcnow
from inferq.store.usage import UsageStore


@dataclass(frozen=True)
class UsagePage:
    buckets: list[UsageBucket]
    next_page: datetime | None
    """Where the next page starts (None: this is the last)."""


class UsageOperations:
    def __init__(
        self, *, usage: UsageStore, keys: KeyStore, clock: Callable[[], datetime] = utcnow
    ) -> None:
        self._usage = usage
        self._keys = keys
        self._clock = clock

    def report(
        self,
        principal: Principal,
        *,
        start: datetime | None = None,
        end: datetime | None = None,
        width: BucketWidth = "1d",
        group_by: Sequence[GroupBy] = (),
        tenant: str | None = None,
        limit: int | None = None,
    ) -> UsagePage:
        """Usage from `start` (by default, a page of buckets back) to `end` (now) in
        buckets of `width`, a page of `limit` of them, each added up by the fields of
        `group_by`. A tenant reads its own; an admin reads `tenant`'s, or every tenant's
        (None)."""
        if tenant is not None and principal.scope not in (None, tenant):
            raise Forbidden("an API key reads only its own tenant's usage: leave out `tenant`")
        scope = principal.scope or tenant
        now = self._clock()
        step = timedelta(seconds=BUCKET_SECONDS[width])
        end = min(end or now, now + step)
        limit = limit or DEFAULT_BUCKETS[width]
        if start is None:
            start = end - step * (limit - 1)
        if end <= start:
            raise InvalidRequest(
                "end_time must come after start_time", param="end_time", code="invalid_value"
            )
        most = MAX_BUCKETS[width]
        if not 1 <= limit <= most:
            raise InvalidRequest(
                f"limit is between 1 and {most} for buckets of {width}",
                param="limit",
                code="invalid_value",
            )
        starts = bucket_starts(start, end, width, most=limit + 1)
        page, rest = starts[:limit], starts[limit:]
        page_end = page[-1] + timedelta(seconds=BUCKET_SECONDS[width]) if page else start
        rows = self._usage.rows(start=page[0] if page else start, end=page_end, tenant=scope)
        return UsagePage(
            buckets=bucketed(rows, page, width=width, group_by=group_by),
            next_page=rest[0] if rest else None,
        )

    def standing(self, principal: Principal) -> QuotaState | None:
        """Where the caller's key stands against its quota (None: it has none, or the
        caller is no stored key, as with authentication off)."""
        try:
            state = self._usage.quota_state(principal.key_id)
        except NotFound:
            return None
        return state if state.quota.any else None

    def keys(self, principal: Principal) -> list[ApiKey]:
        _admin_only(principal)
        return self._keys.list()

    def update_key(self, principal: Principal, key_id: str, **limits: int | None) -> ApiKey:
        """Set a key's limits (see `KeyStore.update`)."""
        _admin_only(principal)
        return self._keys.update(key_id, **limits)


def _admin_only(principal: Principal) -> None:
    if not principal.admin:
        raise Forbidden("only an admin key manages API keys")
