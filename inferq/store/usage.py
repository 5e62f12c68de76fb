"""Usage by tenant, API key, model and hour, added to by the transactions that end jobs and
create batches (so it is exact, and retention, which deletes jobs, never changes it), read
back for `/v1/usage` and `/metrics`; and the quotas of API keys, checked inside the
transactions that queue work.

Lock order: a transaction that adds usage does so last, its rows in key order; one that
checks quotas locks the keys' rows first (in id order), then reads.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Insert, Table, func, select
from sqlalchemy.orm import Session

from inferq.domain.batches import BatchStatus
from inferq.domain.estimates import Estimate
from inferq.domain.jobs import JobStatus
from inferq.domain.usage import Quota, QuotaState, Usage, UsageKey, day_of, hour_of
from inferq.exceptions import InvalidRequest, NotFound, QuotaExceeded
from inferq.store.base import Store, as_utc
from inferq.store.dialects import conflict_insert, on_postgres
from inferq.store.job_rows import ACTIVE
from inferq.store.models import ApiKeyRow, BatchRow, JobRow, UsageRow

_TABLE: Table = UsageRow.__table__  # type: ignore[assignment]
_COUNTS = ("input_tokens", "output_tokens", "embedding_tokens", "jobs", "batch_lines", "batches")
# When a key's queued work frees room is not known beforehand: with no estimate of its
# batches to go by, a refused client is told to try again after this.
QUEUED_RETRY_S = 10


def add_usage(session: Session, added: Mapping[UsageKey, Usage]) -> None:
    """Add usage to its rows in the session's transaction (one statement), creating them."""
    rows = [
        {
            "tenant": key.tenant,
            "key_id": key.key_id,
            "model": key.model,
            "hour": key.hour,
            **{name: getattr(usage, name) for name in _COUNTS},
        }
        for key, usage in sorted(added.items())
    ]
    if not rows:
        return
    # Executed with its rows as parameters, the statement is compiled once a process, not
    # at every flush.
    session.connection().execute(_upsert(on_postgres(session)), rows)


@functools.cache
def _upsert(postgres: bool) -> Insert:
    """Add a row's counts to the row of its tenant, key, model and hour, or create it."""
    statement = conflict_insert(_TABLE, postgres=postgres)
    upsert: Insert = statement.on_conflict_do_update(
        index_elements=["tenant", "key_id", "model", "hour"],
        set_={name: _TABLE.c[name] + statement.excluded[name] for name in _COUNTS},
    )
    return upsert


def ended_usage(
    rows: Iterable[Any], values: Mapping[str, Mapping[str, Any]], now: datetime
) -> dict[UsageKey, Usage]:
    """The usage of jobs just ended: `rows` have `id`, `tenant`, `key_id`, `model`,
    `batch_id` and `prompt_tokens`; `values` are the values that ended each, by job id."""
    added: dict[UsageKey, Usage] = {}
    hour = hour_of(now)
    for row in rows:
        ended = values.get(row.id)
        if ended is None:
            continue
        tokens = Usage()
        if ended["status"] == JobStatus.SUCCEEDED.value:
            if "embedding" in ended:
                tokens = Usage(embedding_tokens=row.prompt_tokens)
            else:
                output = ended.get("completion_tokens") or 0
                tokens = Usage(input_tokens=row.prompt_tokens, output_tokens=output)
        count = Usage(batch_lines=1) if row.batch_id is not None else Usage(jobs=1)
        key = UsageKey(row.tenant, row.key_id or "", row.model, hour)
        added[key] = added.get(key, Usage()) + tokens + count
    return added


@dataclass(frozen=True)
class Demand:
    """Work a key asks to queue: the most it can cost."""

    key_id: str
    tokens: int


def refuse_over_quota(
    session: Session,
    demands: Sequence[Demand],
    *,
    now: datetime,
    excluding_batch: str | None = None,
) -> list[InvalidRequest | QuotaExceeded | None]:
    """For each demand in order, why its key's quota refuses it (None: it fits, and counts
    against the quota for the demands after it). The keys' rows stay locked to the end of
    the transaction, so concurrent submissions of a key are checked one after another.
    `excluding_batch`: a batch whose lines are written already in this transaction."""
    quotas = _locked_quotas(session, sorted({d.key_id for d in demands}))
    states = {
        key_id: _state(session, key_id, quota, now=now, excluding_batch=excluding_batch)
        for key_id, quota in quotas.items()
        if quota.any
    }
    refusals: list[InvalidRequest | QuotaExceeded | None] = []
    for demand in demands:
        state = states.get(demand.key_id)
        refusal = None if state is None else _refusal(session, demand, state, now=now)
        if refusal is None and state is not None:
            states[demand.key_id] = QuotaState(
                quota=state.quota,
                queued_tokens=state.queued_tokens + demand.tokens,
                used_today=state.used_today,
            )
        refusals.append(refusal)
    return refusals


def _locked_quotas(session: Session, key_ids: Sequence[str]) -> dict[str, Quota]:
    rows = session.execute(
        select(ApiKeyRow.id, ApiKeyRow.max_queued_tokens, ApiKeyRow.daily_tokens)
        .where(ApiKeyRow.id.in_(key_ids))
        .order_by(ApiKeyRow.id)
        .with_for_update()
    )
    return {
        row.id: Quota(max_queued_tokens=row.max_queued_tokens, daily_tokens=row.daily_tokens)
        for row in rows
    }


def _state(
    session: Session,
    key_id: str,
    quota: Quota,
    *,
    now: datetime,
    excluding_batch: str | None = None,
) -> QuotaState:
    queued = select(func.coalesce(func.sum(JobRow.cost_tokens), 0)).where(
        JobRow.key_id == key_id, JobRow.status.in_(ACTIVE)
    )
    if excluding_batch is not None:
        queued = queued.where((JobRow.batch_id.is_(None)) | (JobRow.batch_id != excluding_batch))
    used = select(
        func.coalesce(
            func.sum(UsageRow.input_tokens + UsageRow.output_tokens + UsageRow.embedding_tokens),
            0,
        )
    ).where(UsageRow.key_id == key_id, UsageRow.hour >= day_of(now))
    return QuotaState(
        quota=quota,
        queued_tokens=int(session.scalar(queued) or 0),
        used_today=int(session.scalar(used) or 0),
    )


def _refusal(
    session: Session, demand: Demand, state: QuotaState, *, now: datetime
) -> InvalidRequest | QuotaExceeded | None:
    quota, need = state.quota, demand.tokens
    if quota.max_queued_tokens is not None and state.queued_tokens + need > quota.max_queued_tokens:
        if need > quota.max_queued_tokens:
            return _never(need, quota.max_queued_tokens, "max_queued_tokens", "queued at once")
        return QuotaExceeded(
            f"this API key may have {quota.max_queued_tokens} tokens queued or running at "
            f"once (its quota max_queued_tokens); it has {state.queued_tokens}, and this "
            f"needs up to {need} (prompt plus max_tokens times n): it frees up as that work "
            "ends or is cancelled",
            retry_after_s=_queued_retry_s(session, demand.key_id, now=now),
        )
    if quota.daily_tokens is not None and state.tokens_today + need > quota.daily_tokens:
        if need > quota.daily_tokens:
            return _never(need, quota.daily_tokens, "daily_tokens", "a UTC day")
        midnight = day_of(now) + timedelta(days=1)
        frees_tomorrow = state.used_today + need > quota.daily_tokens
        retry_s = (
            math.ceil((midnight - now).total_seconds())
            if frees_tomorrow
            else _queued_retry_s(session, demand.key_id, now=now)
        )
        return QuotaExceeded(
            f"this API key may use {quota.daily_tokens} tokens a UTC day (its quota "
            f"daily_tokens); today it has used {state.used_today} and has "
            f"{state.queued_tokens} queued or running, and this needs up to {need}: "
            + (
                "it resets at 00:00 UTC"
                if frees_tomorrow
                else "it frees up as queued work ends using less than its max_tokens"
            ),
            retry_after_s=max(1, retry_s),
        )
    return None


def _never(need: int, limit: int, name: str, per: str) -> InvalidRequest:
    return InvalidRequest(
        f"this request needs up to {need} tokens (prompt plus max_tokens times n), more than "
        f"this API key's quota of {limit} tokens {per} ({name}): lower max_tokens, split the "
        "work, or ask an admin to raise the quota",
        param="max_tokens",
        code="insufficient_quota",
    )


def _queued_retry_s(session: Session, key_id: str, *, now: datetime) -> int:
    """When the key's queued work first frees room: the soonest its batches in progress
    are expected to end, if they have estimates."""
    estimates = session.scalars(
        select(BatchRow.estimate).where(
            BatchRow.key_id == key_id,
            BatchRow.status == BatchStatus.IN_PROGRESS.value,
            BatchRow.estimate.is_not(None),
        )
    ).all()
    ends = [Estimate.from_dict(e).completion_at for e in estimates if e]
    if not ends:
        return QUEUED_RETRY_S
    return max(1, math.ceil((min(ends) - now).total_seconds()))


class UsageStore(Store):
    """Usage read back, and where keys stand against their quotas."""

    def rows(
        self, *, start: datetime, end: datetime, tenant: str | None = None
    ) -> list[tuple[UsageKey, Usage]]:
        """The usage rows of hours from `start` (its hour) to before `end`; one tenant's,
        or every tenant's (None)."""
        query = select(UsageRow).where(UsageRow.hour >= start, UsageRow.hour < end)
        if tenant is not None:
            query = query.where(UsageRow.tenant == tenant)
        with self._transaction() as session:
            return [
                (
                    UsageKey(row.tenant, row.key_id, row.model, as_utc(row.hour)),
                    Usage(*(getattr(row, name) for name in _COUNTS)),
                )
                for row in session.scalars(query)
            ]

    def totals(self) -> list[tuple[str, str, Usage]]:
        """Every tenant's usage of every model, all time: `(tenant, model, usage)`."""
        sums = [func.sum(_TABLE.c[name]) for name in _COUNTS]
        query = select(UsageRow.tenant, UsageRow.model, *sums).group_by(
            UsageRow.tenant, UsageRow.model
        )
        with self._transaction() as session:
            return [
                (row[0], row[1], Usage(*(int(value or 0) for value in row[2:])))
                for row in session.execute(query)
            ]

    def quota_state(self, key_id: str) -> QuotaState:
        """The key's quota and where it stands against it."""
        with self._transaction() as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                raise NotFound(f"no API key with id {key_id!r}")
            quota = Quota(max_queued_tokens=row.max_queued_tokens, daily_tokens=row.daily_tokens)
            return _state(session, key_id, quota, now=self._clock())
