"""The job store: every SQL statement about jobs lives here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, func, insert, or_, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from inferq.domain.jobs import ACTIVE_STATUSES, ClaimedJob, Job, JobOutcome, JobSpec, JobStatus
from inferq.domain.webhooks import WebhookRequest
from inferq.exceptions import InvalidState
from inferq.store.base import Page, Store, as_utc, newest_first, scoped_row, utcnow
from inferq.store.batch_counts import EndedLine, count_ended, count_finished, lock_batches_of
from inferq.store.bulk import update_rows
from inferq.store.idempotency import IdempotentRequest, record_response
from inferq.store.job_rows import (
    CLAIMED_COLUMNS,
    claimed_job,
    job_from_row,
    new_job,
    new_job_row,
    outcome_values,
)
from inferq.store.models import JobRow
from inferq.store.outbox import EndedJob, enqueue_job_events, ensure_endpoint, wake_delivery

_ACTIVE = [s.value for s in ACTIVE_STATUSES]


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """A job to write: what it asks for, whose it is, and what to do when it ends."""

    spec: JobSpec
    tenant: str
    webhook: WebhookRequest | None = None
    # The idempotency key it was submitted under, whose response is remembered with it.
    idempotency: IdempotentRequest | None = None


@dataclass(frozen=True)
class DueJob:
    """A job to publish again, and the queue it belongs on."""

    id: str
    queue: str


class JobStore(Store):
    """Reads and writes jobs."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        clock: Callable[[], datetime] = utcnow,
        on_webhooks: Callable[[], None] | None = None,
    ) -> None:
        """`on_webhooks` is called after a commit that queued webhook deliveries (to wake
        the delivery worker); if it fails, maintenance finds them anyway."""
        super().__init__(sessions, clock=clock)
        self._on_webhooks = on_webhooks

    def ping(self) -> None:
        with self._transaction() as session:
            session.execute(text("SELECT 1"))

    def create_jobs(
        self,
        specs: Sequence[JobSpec],
        *,
        tenant: str,
        queue: str,
        requeue_after_s: int,
        webhook: WebhookRequest | None = None,
    ) -> list[Job]:
        """Write new queued jobs for `tenant` in one transaction and return them."""
        return self.submit_jobs(
            [NewJob(spec=spec, tenant=tenant, webhook=webhook) for spec in specs],
            queue=queue,
            requeue_after_s=requeue_after_s,
        )

    def submit_jobs(
        self,
        new_jobs: Sequence[NewJob],
        *,
        queue: str | Callable[[JobSpec], str],
        requeue_after_s: int,
        respond: Callable[[Job], dict[str, Any]] | None = None,
    ) -> list[Job]:
        """Write new queued jobs, each for its own tenant, in one transaction; return them.
        `queue` names each one's queue, or is a function of its spec that does.

        A job submitted under an idempotency key has its response (`respond(job)`, the
        body of a 202) remembered in the same transaction, so both are written or neither.
        """
        now = self._clock()
        rows = [
            new_job_row(
                new.spec,
                tenant=new.tenant,
                queue=queue if isinstance(queue, str) else queue(new.spec),
                now=now,
                requeue_after_s=requeue_after_s,
            )
            for new in new_jobs
        ]
        jobs = [new_job(row, new.spec) for row, new in zip(rows, new_jobs, strict=True)]
        with self._transaction() as session:
            endpoints: dict[tuple[str, str], str] = {}
            for row, new in zip(rows, new_jobs, strict=True):
                if new.webhook is None:
                    continue
                target = (new.tenant, new.webhook.url)
                if target not in endpoints:
                    endpoints[target] = ensure_endpoint(
                        session, tenant=new.tenant, url=new.webhook.url, now=now
                    )
                row["webhook_endpoint_id"] = endpoints[target]
                row["webhook_events"] = new.webhook.events
            if rows:
                session.execute(insert(JobRow), rows)
            for job, new in zip(jobs, new_jobs, strict=True):
                if new.idempotency is not None:
                    assert respond is not None, "an idempotent submission needs `respond`"
                    record_response(session, new.idempotency, status_code=202, body=respond(job))
        return jobs

    def mark_unpublished(self, job_ids: Sequence[str]) -> None:
        """Make queued jobs due for publishing at the next maintenance pass."""
        with self._transaction() as session:
            session.execute(
                update(JobRow)
                .where(JobRow.id.in_(job_ids), JobRow.status == JobStatus.QUEUED.value)
                .values(lease_expires_at=self._clock())
                .execution_options(synchronize_session=False)
            )

    def get_job(self, job_id: str, *, scope: str | None = None) -> Job:
        """The job, if it exists and belongs to `scope` (a tenant; None sees every tenant)."""
        with self._transaction() as session:
            return job_from_row(scoped_row(session, JobRow, job_id, scope, noun="job"))

    def get_jobs(self, job_ids: Sequence[str]) -> list[Job]:
        with self._transaction() as session:
            rows = session.scalars(select(JobRow).where(JobRow.id.in_(job_ids))).all()
            return [job_from_row(row) for row in rows]

    def list_jobs(
        self,
        *,
        scope: str | None = None,
        status: JobStatus | None = None,
        batch_id: str | None = None,
        after: str | None = None,
        limit: int = 20,
    ) -> Page[Job]:
        """Jobs newest first; `after` is the id of the last job of the previous page."""
        query = select(JobRow)
        if batch_id is not None:
            query = query.where(JobRow.batch_id == batch_id)
        if scope is not None:
            query = query.where(JobRow.tenant == scope)
        if status is not None:
            query = query.where(JobRow.status == status.value)
        with self._transaction() as session:
            return newest_first(
                session,
                query,
                JobRow.id,
                after=after,
                limit=limit,
                convert=lambda rows: [job_from_row(row) for row in rows],
            )

    def cancel_job(self, job_id: str, *, scope: str | None = None) -> Job:
        """Cancel a queued or running job; a finished one raises `InvalidState`."""
        with self._transaction() as session:
            lock_batches_of(session, [job_id])
            row = scoped_row(session, JobRow, job_id, scope, noun="job", for_update=True)
            if row.status not in _ACTIVE:
                raise InvalidState(
                    f"job {job_id} is already {row.status}: only queued or running jobs "
                    "can be cancelled"
                )
            row.status = JobStatus.CANCELLED.value
            row.finished_at = self._clock()
            row.lease_expires_at = None
            if row.batch_id is not None:
                count_ended(session, [EndedLine(row.batch_id, row.status, 0, None)])
            queued = enqueue_job_events(session, [row], row.finished_at)
            job = job_from_row(row)
        wake_delivery(self._on_webhooks, queued)
        return job

    def claim_jobs(self, job_ids: Sequence[str], *, worker: str, lease_s: int) -> list[ClaimedJob]:
        """Take jobs for `worker`: queued ones, and running ones whose lease ran out.

        Jobs that are finished, cancelled or held under a live lease are skipped, which is
        what makes a redelivered message harmless.
        """
        now = self._clock()
        claimable = or_(
            JobRow.status == JobStatus.QUEUED.value,
            and_(JobRow.status == JobStatus.RUNNING.value, JobRow.lease_expires_at < now),
        )
        statement = (
            update(JobRow)
            .where(JobRow.id.in_(job_ids), claimable)
            .values(
                status=JobStatus.RUNNING.value,
                worker=worker,
                started_at=now,
                lease_expires_at=now + timedelta(seconds=lease_s),
                attempts=JobRow.attempts + 1,
            )
            .returning(*CLAIMED_COLUMNS)
            .execution_options(synchronize_session=False)
        )
        with self._transaction() as session:
            rows = session.execute(statement).all()
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

    def take_due(self, *, requeue_after_s: int, limit: int) -> list[DueJob]:
        """Jobs whose message must be published again: running jobs whose worker stopped
        renewing their lease (they return to queued) and queued jobs not taken in time.
        Their lease moves `requeue_after_s` ahead, so each is returned once per period."""
        now = self._clock()
        due = (
            select(JobRow.id)
            .where(JobRow.status.in_(_ACTIVE), JobRow.lease_expires_at <= now)
            .order_by(JobRow.lease_expires_at)
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        statement = (
            update(JobRow)
            .where(JobRow.id.in_(due.scalar_subquery()))
            .values(
                status=JobStatus.QUEUED.value,
                worker=None,
                lease_expires_at=now + timedelta(seconds=requeue_after_s),
                published_at=now,
            )
            .returning(JobRow.id, JobRow.queue)
            .execution_options(synchronize_session=False)
        )
        with self._transaction() as session:
            return [DueJob(row.id, row.queue) for row in session.execute(statement)]

    def queued_jobs(self, *, requeue_after_s: int) -> list[DueJob]:
        """Every queued job, to publish again after Redis lost its data."""
        now = self._clock()
        statement = (
            update(JobRow)
            .where(JobRow.status == JobStatus.QUEUED.value)
            .values(lease_expires_at=now + timedelta(seconds=requeue_after_s), published_at=now)
            .returning(JobRow.id, JobRow.queue)
            .execution_options(synchronize_session=False)
        )
        with self._transaction() as session:
            rows = session.execute(statement).all()
        return sorted((DueJob(row.id, row.queue) for row in rows), key=lambda j: j.id)

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

    def published_at(self, job_ids: Sequence[str]) -> datetime | None:
        """When the earliest of these jobs was last published (None if none exist)."""
        with self._transaction() as session:
            value = session.scalar(
                select(func.min(JobRow.published_at)).where(JobRow.id.in_(job_ids))
            )
        return as_utc(value)

    def take_stranded(
        self, *, queue: str, published_before: datetime, requeue_after_s: int, limit: int
    ) -> list[DueJob]:
        """Queued jobs of `queue` published before `published_before`: their messages have
        left Redis's list, yet no worker claimed them (it died first). Publish again."""
        now = self._clock()
        stranded = (
            select(JobRow.id)
            .where(
                JobRow.status == JobStatus.QUEUED.value,
                JobRow.queue == queue,
                JobRow.published_at < published_before,
            )
            .limit(limit)
            .with_for_update(skip_locked=True)
        )
        statement = (
            update(JobRow)
            .where(JobRow.id.in_(stranded.scalar_subquery()))
            .values(lease_expires_at=now + timedelta(seconds=requeue_after_s), published_at=now)
            .returning(JobRow.id, JobRow.queue)
            .execution_options(synchronize_session=False)
        )
        with self._transaction() as session:
            return [DueJob(row.id, row.queue) for row in session.execute(statement)]

    def finish_jobs(self, outcomes: Sequence[JobOutcome]) -> list[str]:
        """Write results and errors in one transaction, each only if its job is still
        queued or running. Returns the ids written; the others had already ended."""
        if not outcomes:
            return []
        now = self._clock()
        ids = [o.job_id for o in outcomes]
        with self._transaction() as session:
            lock_batches_of(session, ids)
            rows = session.execute(
                select(
                    JobRow.id,
                    JobRow.tenant,
                    JobRow.webhook_endpoint_id,
                    JobRow.webhook_events,
                    JobRow.batch_id,
                    JobRow.prompt_tokens,
                )
                .where(JobRow.id.in_(ids), JobRow.status.in_(_ACTIVE))
                .with_for_update()
            ).all()
            live = {row.id for row in rows}
            values = {o.job_id: outcome_values(o, now) for o in outcomes if o.job_id in live}
            update_rows(session, JobRow, list(values.values()))
            count_finished(session, rows, values)
            queued = enqueue_job_events(
                session,
                [
                    EndedJob(row.id, row.tenant, values[row.id]["status"], *row[2:4])
                    for row in rows
                    if row.webhook_endpoint_id is not None
                ],
                now,
            )
        wake_delivery(self._on_webhooks, queued)
        return [job_id for job_id in ids if job_id in live]
