"""Usage and quotas: what tenants used, by API key, model and hour, and the limits an
admin sets on a key. Plain data and the arithmetic of buckets; the store keeps the rows
(inferq/store/usage.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta
from typing import Literal

BucketWidth = Literal["1h", "1d"]
BUCKET_SECONDS: dict[str, int] = {"1h": 3600, "1d": 86400}
GroupBy = Literal["model", "api_key_id", "tenant"]
GROUPS: tuple[GroupBy, ...] = ("model", "api_key_id", "tenant")
# Most buckets a page holds, and how many it holds unless asked (as OpenAI's usage API).
MAX_BUCKETS = {"1h": 168, "1d": 31}
DEFAULT_BUCKETS = {"1h": 24, "1d": 7}


@dataclass(frozen=True)
class Usage:
    """Tokens and requests, added up."""

    input_tokens: int = 0
    """Prompt tokens of generation."""
    output_tokens: int = 0
    """Tokens generated."""
    embedding_tokens: int = 0
    """Tokens embedded (`/v1/embeddings`)."""
    jobs: int = 0
    """Single jobs (online requests included) that ended with a result or an error."""
    batch_lines: int = 0
    """Batch lines that ended with a result or an error."""
    batches: int = 0
    """Batches created."""

    def __add__(self, other: Usage) -> Usage:
        return Usage(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.embedding_tokens

    @property
    def requests(self) -> int:
        return self.jobs + self.batch_lines

    @classmethod
    def sum(cls, usages: Iterable[Usage]) -> Usage:
        total = cls()
        for usage in usages:
            total += usage
        return total


@dataclass(frozen=True, order=True)
class UsageKey:
    """Whose usage of which model, in which hour (UTC): one row of the store."""

    tenant: str
    key_id: str
    """The API key ("" for work no key submitted: `inferq run`)."""
    model: str
    hour: datetime


def hour_of(moment: datetime) -> datetime:
    """The UTC hour `moment` falls in."""
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def day_of(moment: datetime) -> datetime:
    """The UTC day `moment` falls in."""
    return hour_of(moment).replace(hour=0)


@dataclass(frozen=True)
class UsageResult:
    """One group's usage within a bucket; a field not grouped by is None."""

    usage: Usage
    model: str | None = None
    api_key_id: str | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class UsageBucket:
    start: datetime
    end: datetime
    results: list[UsageResult] = field(default_factory=list)


def bucket_starts(
    start: datetime, end: datetime, width: BucketWidth, *, most: int | None = None
) -> list[datetime]:
    """The starts of the buckets of `width` from the one `start` falls in to the last that
    begins before `end` (the first `most` of them); days and hours in UTC."""
    step = timedelta(seconds=BUCKET_SECONDS[width])
    first = day_of(start) if width == "1d" else hour_of(start)
    count = max(0, math.ceil((end - first) / step))
    return [first + step * i for i in range(count if most is None else min(count, most))]


def bucketed(
    rows: Iterable[tuple[UsageKey, Usage]],
    starts: Sequence[datetime],
    *,
    width: BucketWidth,
    group_by: Sequence[GroupBy],
) -> list[UsageBucket]:
    """`rows` added up into the buckets that begin at `starts`, a result per group; every
    bucket is listed, an empty one with no results."""
    step = timedelta(seconds=BUCKET_SECONDS[width])
    sums: dict[datetime, dict[tuple[str | None, ...], Usage]] = {s: {} for s in starts}
    for key, usage in rows:
        start = day_of(key.hour) if width == "1d" else key.hour
        groups = sums.get(start)
        if groups is None:
            continue
        group = (
            key.model if "model" in group_by else None,
            key.key_id if "api_key_id" in group_by else None,
            key.tenant if "tenant" in group_by else None,
        )
        groups[group] = groups.get(group, Usage()) + usage
    return [
        UsageBucket(
            start=start,
            end=start + step,
            results=[
                UsageResult(usage=usage, model=model, api_key_id=key_id, tenant=tenant)
                for (model, key_id, tenant), usage in sorted(
                    sums[start].items(), key=lambda item: tuple(v or "" for v in item[0])
                )
            ],
        )
        for start in starts
    ]


@dataclass(frozen=True, kw_only=True)
class Quota:
    """What an admin allows an API key; None: no limit."""

    max_queued_tokens: int | None = None
    """Prompt plus `max_tokens` (times `n`) of its jobs queued or running at once."""
    daily_tokens: int | None = None
    """Tokens a UTC day: those its ended work used, plus the most its queued and running
    work can still use."""

    @property
    def any(self) -> bool:
        return self.max_queued_tokens is not None or self.daily_tokens is not None


@dataclass(frozen=True, kw_only=True)
class QuotaState:
    """A key's standing against its quota."""

    quota: Quota
    queued_tokens: int
    """The most its queued and running jobs can cost."""
    used_today: int
    """Tokens its work that ended today (UTC) used."""

    @property
    def tokens_today(self) -> int:
        """What counts against the daily quota: used today, plus what is queued."""
        return self.used_today + self.queued_tokens
