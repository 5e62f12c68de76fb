"""Claiming batch lines in the order work is shared (inferq/domain/fair_share.py): the
GPU worker asks for as many lines as its engine has room for, and gets the next ones of
each tenant in turn. A flex single job (`service_tier: flex`) counts in its tenant's
share as one of its lines would. `JobStore` has these calls."""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime

from sqlalchemy import (
    ColumnElement,
    Connection,
    Insert,
    bindparam,
    exists,
    literal_column,
    select,
    update,
)

from inferq.domain.batches import BatchStatus
from inferq.domain.fair_share import ALONE, FleetShare, Share, WaitingBatch, joined, split
from inferq.domain.jobs import ClaimedJob, JobStatus
from inferq.domain.queue_names import bulk_queue_beside
from inferq.store.base import as_utc
from inferq.store.batch_work import tenant_weight
from inferq.store.dialects import conflict_insert, on_postgres
from inferq.store.job_leases import JobLeases
from inferq.store.models import BatchRow, JobRow, ShareClockRow, ShareRow

# Written into the statements, not bound: a generic plan cannot prove that a parameter is
# 'queued', so it would not read a batch's queued lines through ix_jobs_batch_queued.
_QUEUED: ColumnElement[str] = literal_column(f"'{JobStatus.QUEUED.value}'")


class BatchClaims(JobLeases):
    """Batch lines taken for a worker, fairly between tenants: chosen here, then claimed
    by the one claim every job goes through (`JobLeases.claim_jobs`), in the same
    transaction."""

    def claim_jobs(
        self,
        job_ids: Sequence[str],
        *,
        worker: str,
        lease_s: int,
        within: Connection | None = None,
    ) -> list[ClaimedJob]:
        """As `JobLeases.claim_jobs`; each flex job claimed counts in its tenant's share of
        its model's batch work, as a line claimed for the tenant does."""
        claimed = super().claim_jobs(job_ids, worker=worker, lease_s=lease_s, within=within)
        if flex := [job.id for job in claimed if job.flex]:
            self._count_in_shares(flex)
        return claimed

    def _count_in_shares(self, job_ids: Sequence[str]) -> None:
        """Move each tenant's finish time on by its flex jobs among `job_ids`, as its
        lines claimed would (from the queue's clock if it is behind)."""
        with self._transaction() as session:
            connection = session.connection()
            rows = connection.execute(_FLEX_TENANTS, {"ids": list(job_ids)}).all()
            counts = Counter((bulk_queue_beside(row.queue), row.tenant) for row in rows)
            weights = {row.tenant: float(max(row.weight, 1)) for row in rows}
            for queue in sorted({queue for queue, _ in counts}):
                clock = _locked_clock(connection, queue)
                tenants = sorted(tenant for each, tenant in counts if each == queue)
                finishes = _finishes(connection, queue, tenants)
                moved = {
                    t: joined(finishes.get(t), clock) + counts[queue, t] / weights[t]
                    for t in tenants
                }
                _save(connection, queue, clock=clock, finishes=moved)

    def claim_batch_lines(
        self,
        *,
        queue: str,
        worker: str,
        lease_s: int,
        limit: int,
        fleet: FleetShare = ALONE,
    ) -> list[ClaimedJob]:
        """Up to `limit` queued batch lines of `queue` for `worker`, and no more than its
        `fleet` share of what is left; shared between the tenants that have lines waiting as
        their weights say; each batch's lines in input order. Claims of one queue take
        turns (its clock row is locked meanwhile)."""
        if limit <= 0:
            return []
        with self._transaction() as session:
            # Statements built once, on the session's connection: an ORM session building
            # and running each anew cost most of a claim's CPU.
            connection = session.connection()
            # Found before the clock is locked: an idle worker's look (every second) takes
            # no lock and writes nothing. Lines another claim takes meanwhile are skipped.
            waiting = _waiting_batches(connection, queue)
            limit = min(limit, fleet.most(waiting))
            if not waiting or limit <= 0:
                return []
            clock = _locked_clock(connection, queue)
            tenants = sorted({batch.tenant for batch in waiting})
            weights = {batch.tenant: batch.weight for batch in waiting}
            finishes = _finishes(connection, queue, tenants)
            shares = {t: Share(weights[t], joined(finishes.get(t), clock)) for t in tenants}
            batches = {
                t: sorted((b for b in waiting if b.tenant == t), key=lambda b: b.order)
                for t in tenants
            }
            claimed: list[ClaimedJob] = []
            served: dict[str, float] = {}
            # A tenant whose batches have fewer lines waiting than its share leaves the
            # rest to the others.
            while len(claimed) < limit and shares:
                for tenant, count in split(shares, limit - len(claimed)).items():
                    got = _claim_in_order(
                        connection,
                        batches[tenant],
                        count,
                        queue=queue,
                        claim=functools.partial(self.claim_jobs, worker=worker, lease_s=lease_s),
                    )
                    claimed += got
                    share = shares.pop(tenant)
                    if len(got) == count:
                        shares[tenant] = Share(share.weight, share.finish + count / share.weight)
                    if got:
                        served[tenant] = share.finish + len(got) / share.weight
            # Where the share has got to: the earliest finish of the tenants still
            # waiting (or, if none is, the latest of those served), never earlier than
            # before.
            ahead = [share.finish for share in shares.values()] or list(served.values())
            if ahead:
                clock = max(clock, min(ahead) if shares else max(ahead))
            _save(connection, queue, clock=clock, finishes=served)
            return claimed


# Batches in progress with a line of the queue still queued.
_WAITING = select(
    BatchRow.id,
    BatchRow.tenant,
    tenant_weight(BatchRow.tenant).label("weight"),
    BatchRow.priority,
    BatchRow.expires_at,
    BatchRow.created_at,
    (BatchRow.request_total - BatchRow.request_completed - BatchRow.request_failed).label(
        "unfinished"
    ),
).where(
    BatchRow.status == BatchStatus.IN_PROGRESS.value,
    exists().where(
        JobRow.batch_id == BatchRow.id,
        JobRow.status == _QUEUED,
        JobRow.queue == bindparam("queue"),
    ),
)

_FLEX_TENANTS = select(
    JobRow.queue, JobRow.tenant, tenant_weight(JobRow.tenant).label("weight")
).where(JobRow.id.in_(bindparam("ids", expanding=True)))

_CLOCK = (
    select(ShareClockRow.clock).where(ShareClockRow.queue == bindparam("queue")).with_for_update()
)

_FINISHES = select(ShareRow.tenant, ShareRow.finish).where(
    ShareRow.queue == bindparam("queue"), ShareRow.tenant.in_(bindparam("tenants", expanding=True))
)

# A batch's next lines, in input order; lines another claim holds are skipped.
_NEXT_LINES = (
    select(JobRow.id)
    .where(
        JobRow.batch_id == bindparam("batch_id"),
        JobRow.status == _QUEUED,
        JobRow.queue == bindparam("queue"),
    )
    .order_by(JobRow.line)
    .limit(bindparam("count"))
    .with_for_update(skip_locked=True)
)

_SET_CLOCK = (
    update(ShareClockRow)
    .where(ShareClockRow.queue == bindparam("of_queue"))
    .values(clock=bindparam("new_clock"))
)


@functools.cache
def _clock_row(postgres: bool) -> Insert:
    """A queue's clock row, made at 0 if it has none."""
    insert: Insert = (
        conflict_insert(ShareClockRow, postgres=postgres).values(
            queue=bindparam("of_queue"), clock=0.0
        )
    ).on_conflict_do_nothing()
    return insert


@functools.cache
def _set_finishes(postgres: bool) -> Insert:
    """Tenants' finishes, made or replaced (executed with a row of values each)."""
    statement = conflict_insert(ShareRow, postgres=postgres)
    upsert: Insert = statement.on_conflict_do_update(
        index_elements=["queue", "tenant"], set_={"finish": statement.excluded.finish}
    )
    return upsert


def _locked_clock(connection: Connection, queue: str) -> float:
    connection.execute(_clock_row(on_postgres(connection)), {"of_queue": queue})
    return float(connection.scalar(_CLOCK, {"queue": queue}) or 0.0)


def _waiting_batches(connection: Connection, queue: str) -> list[WaitingBatch]:
    """Batches in progress with a line of `queue` still queued."""
    return [
        WaitingBatch(
            id=row.id,
            tenant=row.tenant,
            weight=float(max(row.weight, 1)),
            priority=row.priority,
            expires_at=_utc(row.expires_at),
            created_at=_utc(row.created_at),
            unfinished=row.unfinished,
        )
        for row in connection.execute(_WAITING, {"queue": queue})
    ]


def _finishes(
    connection: Connection, queue: str, tenants: Sequence[str]
) -> dict[str, float | None]:
    rows = connection.execute(_FINISHES, {"queue": queue, "tenants": list(tenants)})
    return {tenant: finish for tenant, finish in rows}


def _claim_in_order(
    connection: Connection,
    batches: list[WaitingBatch],
    count: int,
    *,
    queue: str,
    claim: Callable[..., list[ClaimedJob]],
) -> list[ClaimedJob]:
    """Up to `count` lines of these batches (a tenant's, in its order), each batch's in
    input order; a batch found with none left is dropped from `batches`."""
    claimed: list[ClaimedJob] = []
    while batches and len(claimed) < count:
        wanted = count - len(claimed)
        ids = connection.scalars(
            _NEXT_LINES, {"batch_id": batches[0].id, "queue": queue, "count": wanted}
        ).all()
        if len(ids) < wanted:
            batches.pop(0)
        if ids:
            claimed += claim(ids, within=connection)
    return claimed


def _save(connection: Connection, queue: str, *, clock: float, finishes: dict[str, float]) -> None:
    connection.execute(_SET_CLOCK, {"of_queue": queue, "new_clock": clock})
    rows = [{"queue": queue, "tenant": t, "finish": f} for t, f in sorted(finishes.items())]
    if rows:
        connection.execute(_set_finishes(on_postgres(connection)), rows)


def _utc(value: datetime) -> datetime:
    converted = as_utc(value)
    assert converted is not None
    return converted
