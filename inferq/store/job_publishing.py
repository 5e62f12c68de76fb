"""Which jobs' messages to publish again: Postgres is the record, Redis only carries the
messages, so maintenance takes from here the jobs whose message was lost or never sent.
`JobStore` has these calls."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update

from inferq.domain.jobs import JobStatus
from inferq.store.base import Store, as_utc
from inferq.store.job_rows import ACTIVE
from inferq.store.models import JobRow


@dataclass(frozen=True)
class DueJob:
    """A job to publish again, and the queue it belongs on."""

    id: str
    queue: str


class JobPublishing(Store):
    """When jobs were published, and the jobs due to be published again."""

    def mark_unpublished(self, job_ids: Sequence[str]) -> None:
        """Make queued jobs due for publishing at the next maintenance pass."""
        with self._transaction() as session:
            session.execute(
                update(JobRow)
                .where(JobRow.id.in_(job_ids), JobRow.status == JobStatus.QUEUED.value)
                .values(lease_expires_at=self._clock())
                .execution_options(synchronize_session=False)
            )

    def take_due(self, *, requeue_after_s: int, limit: int) -> list[DueJob]:
        """Jobs whose message must be published again: running jobs whose worker stopped
        renewing their lease (they return to queued) and queued jobs not taken in time.
        Their lease moves `requeue_after_s` ahead, so each is returned once per period."""
        now = self._clock()
        due = (
            select(JobRow.id)
            .where(JobRow.status.in_(ACTIVE), JobRow.lease_expires_at <= now)
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

    def published_at(self, job_ids: Sequence[str]) -> datetime | None:
        """When the earliest of these jobs was last published (None if none exist)."""
        with self._transaction() as session:
            value = session.scalar(
                select(func.min(JobRow.published_at)).where(JobRow.id.in_(job_ids))
            )
        return as_utc(value)

    def count_waiting(self, *, queues: Sequence[str], published_before: datetime) -> int:
        """Queued jobs of these queues last published before `published_before` and held
        by no live worker since (one that holds a job waiting for room touches it)."""
        statement = (
            select(func.count())
            .select_from(JobRow)
            .where(
                JobRow.status == JobStatus.QUEUED.value,
                JobRow.queue.in_(queues),
                JobRow.published_at < published_before,
            )
        )
        with self._transaction() as session:
            return session.scalar(statement) or 0

    def take_unclaimed(
        self, *, queue: str, published_before: datetime, requeue_after_s: int, limit: int
    ) -> list[DueJob]:
        """Queued jobs of `queue` published before `published_before`: their messages have
        left Redis's list, yet no worker claimed them (it died first). Publish again."""
        now = self._clock()
        unclaimed = (
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
            .where(JobRow.id.in_(unclaimed.scalar_subquery()))
            .values(lease_expires_at=now + timedelta(seconds=requeue_after_s), published_at=now)
            .returning(JobRow.id, JobRow.queue)
            .execution_options(synchronize_session=False)
        )
        with self._transaction() as session:
            return [DueJob(row.id, row.queue) for row in session.execute(statement)]
