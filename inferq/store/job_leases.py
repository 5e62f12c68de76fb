"""The GPU worker's half of the job store: jobs claimed under a lease, leases renewed while
the engine runs them, jobs given back at shutdown, and results written. `JobStore` has
these calls; the worker depends on them alone (`worker.store.WorkerStore`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import Connection, and_, or_, update

from inferq.domain.jobs import ClaimedJob, JobOutcome, JobStatus
from inferq.store.claim import claim_on_postgres, claim_on_sqlite, claim_within
from inferq.store.flush import flush_on_postgres, flush_on_sqlite
from inferq.store.job_rows import claimed_job
from inferq.store.models import JobRow
from inferq.store.outbox import OutboxStore


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
            rows = claim_within(within, values)
        elif self._postgres:
            with self._driver() as driver:
                rows = claim_on_postgres(driver, self._engine.dialect, values)
        else:
            with self._statement() as connection:
                rows = claim_on_sqlite(connection, values)
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

    def give_back_jobs(
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

    def finish_jobs(
        self, outcomes: Sequence[JobOutcome], *, now: datetime | None = None
    ) -> list[str]:
        """Write results and errors all or nothing, each only if its job is still queued
        or running, as finished at `now` (the store's clock if None), with the jobs'
        usage, their batches' counts and the webhook deliveries they asked for (the
        flush: inferq/store/flush.py). Returns the ids written; the others had already
        ended."""
        if not outcomes:
            return []
        now = now or self._clock()
        if self._postgres:
            with self._driver() as driver:
                flushed = flush_on_postgres(driver, outcomes, now)
        else:
            with self._transaction() as session:
                flushed = flush_on_sqlite(session, outcomes, now)
        self._wake_delivery(flushed.queued)
        return [o.job_id for o in outcomes if o.job_id in flushed.written]
