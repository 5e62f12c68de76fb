"""The GPU worker's half of the job store: jobs claimed under a lease, leases renewed while
the engine runs them, jobs given back at shutdown, and results written. `JobStore` has
these calls; the worker depends on them alone (`worker.store.WorkerStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    String,
    Update,
    and_,
    any_,
    bindparam,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from inferq.domain.jobs import ClaimedJob, JobOutcome, JobStatus
from inferq.store.base import DriverStatement
from inferq.store.batch_counts import count_finished
from inferq.store.job_endings import end_jobs
from inferq.store.job_rows import ACTIVE, CLAIMED_COLUMNS, claimed_job, outcome_values
from inferq.store.models import JobRow, Timestamp
from inferq.store.outbox import EndedJob, OutboxStore, enqueue_job_events
from inferq.store.usage import add_usage, ended_usage


def _claim(ids: ColumnElement[bool]) -> Update:
    """The claim of the jobs whose ids `ids` matches: queued ones, and running ones
    whose lease ran out."""
    return (
        update(JobRow)
        .where(
            ids,
            or_(
                JobRow.status == JobStatus.QUEUED.value,
                and_(
                    JobRow.status == JobStatus.RUNNING.value,
                    JobRow.lease_expires_at < bindparam("claim_now", type_=Timestamp),
                ),
            ),
        )
        .values(
            status=JobStatus.RUNNING.value,
            worker=bindparam("claim_worker"),
            started_at=bindparam("claim_now", type_=Timestamp),
            lease_expires_at=bindparam("claim_lease_until", type_=Timestamp),
            attempts=JobRow.attempts + 1,
        )
        .returning(*CLAIMED_COLUMNS)
    )


# Built once: a claim is the worker's hottest statement (one a task), and compiling it
# through an ORM session each time would cost more than the round trip.
_CLAIM = _claim(JobRow.id.in_(bindparam("ids", expanding=True)))

# On Postgres, compiled once to the text psycopg runs, with the ids as one array, so
# that no claim renders its list of ids into the statement again.
_CLAIM_ON_POSTGRES = DriverStatement(
    _claim(JobRow.id == any_(bindparam("ids", type_=ARRAY(String))))
)


# A flush on SQLite (`inferq run`: one writer at a time, so nothing to lock): the rows
# of the jobs still queued or running, with what it needs of them (whose they are, their
# webhooks, batches and prompt sizes), read before they are updated. On Postgres a flush
# is one statement (inferq/store/job_endings.py).
_FINISHING = select(
    JobRow.id,
    JobRow.tenant,
    JobRow.webhook_endpoint_id,
    JobRow.webhook_events,
    JobRow.batch_id,
    JobRow.prompt_tokens,
    JobRow.key_id,
    JobRow.model,
).where(JobRow.id.in_(bindparam("ids", expanding=True)), JobRow.status.in_(ACTIVE))


class JobLeases(OutboxStore):
    """Claims, leases and results of the jobs GPU workers run."""

    def claim_jobs(
        self,
        job_ids: Sequence[str],
        *,
        worker: str,
        lease_s: int,
        within: Connection | None = None,
    ) -> list[ClaimedJob]:
        """Take jobs for `worker`: queued ones, and running ones whose lease ran out.

        Jobs that are finished, cancelled or held under a live lease are skipped, which is
        what makes a redelivered message harmless. `within`: the transaction of a claim
        of batch lines (inferq/store/batch_claims.py), which chose them.
        """
        now = self._clock()
        values = {
            "ids": list(job_ids),
            "claim_now": now,
            "claim_worker": worker,
            "claim_lease_until": now + timedelta(seconds=lease_s),
        }
        if within is not None:
            rows = _claimed(within, values)
        elif self._engine.dialect.name == "postgresql":
            with self._driver() as driver:
                rows = _CLAIM_ON_POSTGRES.driver_rows(driver, self._engine.dialect, values)
        else:
            with self._statement() as connection:
                rows = _claimed(connection, values)
        by_id = {row.id: claimed_job(row, now) for row in rows}
        return [by_id[job_id] for job_id in job_ids if job_id in by_id]

    def renew_leases(self, job_ids: Sequence[str], *, worker: str, lease_s: int) -> set[str]:
        """Extend `worker`'s leases; return the ids it no longer holds (cancelled, finished
        or taken by another worker). A job that went back to queued while `worker` still
        had it (its lease lapsed during a database outage) is taken back: nobody else has
        it, and its work is already in this worker's engine."""
        if not job_ids:
            return set()
        statement = (
            update(JobRow)
            .where(
                JobRow.id.in_(job_ids),
                or_(
                    and_(JobRow.status == JobStatus.RUNNING.value, JobRow.worker == worker),
                    JobRow.status == JobStatus.QUEUED.value,
                ),
            )
            .values(
                status=JobStatus.RUNNING.value,
                worker=worker,
                lease_expires_at=self._clock() + timedelta(seconds=lease_s),
            )
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        )
        with self._transaction() as session:
            held = set(session.scalars(statement).all())
        return set(job_ids) - held

    def release_jobs(
        self, job_ids: Sequence[str], *, worker: str, requeue_after_s: int
    ) -> list[str]:
        """Give `worker`'s unfinished jobs back (status queued), e.g. when it shuts down.
        Their messages go back to Redis too; the lease is a fallback should they not."""
        if not job_ids:
            return []
        statement = (
            update(JobRow)
            .where(
                JobRow.id.in_(job_ids),
                JobRow.status == JobStatus.RUNNING.value,
                JobRow.worker == worker,
            )
            .values(
                status=JobStatus.QUEUED.value,
                worker=None,
                started_at=None,
                lease_expires_at=self._clock() + timedelta(seconds=requeue_after_s),
            )
            .returning(JobRow.id)
            .execution_options(synchronize_session=False)
        )
        with self._transaction() as session:
            return list(session.scalars(statement).all())

    def touch_published(self, job_ids: Sequence[str]) -> None:
        """Note that these queued jobs' messages are held by a live worker right now."""
        if not job_ids:
            return
        with self._transaction() as session:
            session.execute(
                update(JobRow)
                .where(JobRow.id.in_(job_ids), JobRow.status == JobStatus.QUEUED.value)
                .values(published_at=self._clock())
                .execution_options(synchronize_session=False)
            )

    def finish_jobs(self, outcomes: Sequence[JobOutcome]) -> list[str]:
        """Write results and errors in one transaction, each only if its job is still
        queued or running, with the jobs' usage, their batches' counts and the webhook
        deliveries they asked for. Returns the ids written; the others had already
        ended."""
        if not outcomes:
            return []
        now = self._clock()
        if self._engine.dialect.name == "postgresql":
            with self._driver() as driver:
                ended = end_jobs(driver, outcomes, now)
            written = {job.id for job in ended}
            self._wake_delivery(sum(job.queued for job in ended))
            return [o.job_id for o in outcomes if o.job_id in written]
        ended_values = {o.job_id: outcome_values(o, now) for o in outcomes}
        with self._transaction() as session:
            rows = session.connection().execute(_FINISHING, {"ids": list(ended_values)}).all()
            if rows:
                session.execute(update(JobRow), [ended_values[row.id] for row in rows])
            values = {row.id: ended_values[row.id] for row in rows}
            count_finished(session, rows, values)
            add_usage(session, ended_usage(rows, values, now))
            queued = enqueue_job_events(
                session,
                [
                    EndedJob(row.id, row.tenant, values[row.id]["status"], *row[2:4])
                    for row in rows
                    if row.webhook_endpoint_id is not None
                ],
                now,
            )
        self._wake_delivery(queued)
        return [o.job_id for o in outcomes if o.job_id in values]


def _claimed(connection: Connection, values: dict[str, Any]) -> Sequence[Any]:
    """The rows (`CLAIMED_COLUMNS`) of the jobs a claim with `values` takes."""
    if connection.dialect.name == "postgresql":
        return _CLAIM_ON_POSTGRES.rows(connection, values)
    return connection.execute(_CLAIM, values).all()
