"""How a batch ends: stopped (cancelled, or expired past its window), found with every line
ended, then finalized with its output and error files. `BatchStore` has these calls."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import exists, func, select, update
from sqlalchemy.orm import Session

from inferq.domain.batches import Batch, BatchStatus
from inferq.domain.jobs import JobStatus
from inferq.exceptions import InvalidState
from inferq.store.batch_rows import batch_from_row, output_expiry, scoped_batch
from inferq.store.files import FileSize, add_output_file
from inferq.store.job_rows import ACTIVE
from inferq.store.models import BatchRow, JobRow
from inferq.store.outbox import OutboxStore, enqueue_batch_event

_FINALIZABLE = [
    BatchStatus.IN_PROGRESS.value,
    BatchStatus.FINALIZING.value,
    BatchStatus.CANCELLING.value,
]


class BatchEndings(OutboxStore):
    """Stops batches, and finalizes those whose lines have all ended."""

    def stop(
        self, batch_id: str, *, scope: str | None = None, code: str, message: str
    ) -> tuple[Batch, list[str]]:
        """Cancel (or expire) a batch: every line not yet finished ends now with `code`.
        Returns the batch and the ids of the lines a worker may hold, to abort them."""
        now = self._clock()
        with self._transaction() as session:
            row = scoped_batch(session, batch_id, scope, now, for_update=True)
            if row.status not in (BatchStatus.IN_PROGRESS.value, BatchStatus.VALIDATING.value):
                raise InvalidState(
                    f"batch {batch_id} is {row.status}: only a batch in progress can be stopped"
                )
            stopped = session.execute(
                update(JobRow)
                .where(JobRow.batch_id == batch_id, JobRow.status.in_(ACTIVE))
                .values(
                    status=JobStatus.CANCELLED.value,
                    finished_at=now,
                    lease_expires_at=None,
                    error={"code": code, "message": message},
                )
                .returning(JobRow.id, JobRow.attempts)
                .execution_options(synchronize_session=False)
            )
            # Lines ever claimed may be held by a worker: a claim that commits while this
            # update waits for its rows is seen here (a read before it would miss it). A
            # line given back since is told too; no worker holds it, so none minds.
            ended = stopped.all()
            running = [job_id for job_id, attempts in ended if attempts > 0]
            row.request_failed += len(ended)
            if code == "batch_expired":
                row.expired_at = now
            else:
                row.status, row.cancelling_at = BatchStatus.CANCELLING.value, now
            return batch_from_row(row), running

    def expired(self, *, limit: int = 100) -> list[str]:
        """Batches in progress whose completion window has run out."""
        with self._transaction() as session:
            return list(
                session.scalars(
                    select(BatchRow.id)
                    .where(
                        BatchRow.status == BatchStatus.IN_PROGRESS.value,
                        BatchRow.expired_at.is_(None),
                        BatchRow.expires_at < self._clock(),
                    )
                    .limit(limit)
                )
            )

    def finished(self, batch_ids: Sequence[str] | None = None) -> list[str]:
        """Batches (of these, or any) whose lines have all ended but are not finalized."""
        active = exists().where(JobRow.batch_id == BatchRow.id, JobRow.status.in_(ACTIVE))
        query = select(BatchRow.id).where(BatchRow.status.in_(_FINALIZABLE), ~active)
        if batch_ids is not None:
            query = query.where(BatchRow.id.in_(batch_ids))
        with self._transaction() as session:
            return list(session.scalars(query.limit(1000)))

    def start_finalizing(self, batch_id: str) -> Batch | None:
        """Mark a batch whose lines have all ended as finalizing; None if it is not ready
        (lines still active) or already final."""
        with self._transaction() as session:
            row = session.get(BatchRow, batch_id, with_for_update=True)
            if row is None or row.status not in _FINALIZABLE:
                return None
            active = session.scalar(
                select(exists().where(JobRow.batch_id == batch_id, JobRow.status.in_(ACTIVE)))
            )
            if active:
                return None
            if row.status == BatchStatus.IN_PROGRESS.value:
                row.status = BatchStatus.FINALIZING.value
            row.finalizing_at = row.finalizing_at or self._clock()
            return batch_from_row(row)

    def ended_lines(self, batch_id: str) -> tuple[int, int]:
        """How many of a batch's lines succeeded, and how many failed or were cancelled."""
        failed = (JobStatus.FAILED.value, JobStatus.CANCELLED.value)
        query = select(
            func.count().filter(JobRow.status == JobStatus.SUCCEEDED.value),
            func.count().filter(JobRow.status.in_(failed)),
        ).where(JobRow.batch_id == batch_id)
        with self._transaction() as session:
            succeeded, others = session.execute(query).one()
        return int(succeeded), int(others)

    def finish_finalizing(
        self, batch_id: str, *, output: FileSize, errors: FileSize
    ) -> Batch | None:
        """Record the output and error files (of these sizes; an empty one is not made)
        and end the batch: completed, cancelled or expired."""
        now = self._clock()
        with self._transaction() as session:
            row = session.get(BatchRow, batch_id, with_for_update=True)
            if row is None or row.status not in _FINALIZABLE:
                return None
            row.output_expires_at = output_expiry(row, now)
            row.output_file_id = _result_file(session, row, "output", output, now)
            row.error_file_id = _result_file(session, row, "errors", errors, now)
            if row.status == BatchStatus.CANCELLING.value:
                row.status, row.cancelled_at = BatchStatus.CANCELLED.value, now
            elif row.expired_at is not None:
                row.status = BatchStatus.EXPIRED.value
            else:
                row.status, row.completed_at = BatchStatus.COMPLETED.value, now
            batch = batch_from_row(row)
            queued = enqueue_batch_event(session, row, now)
        self._wake_delivery(queued)
        return batch


def _result_file(
    session: Session, row: BatchRow, kind: str, size: FileSize, now: datetime
) -> str | None:
    if not size.lines:
        return None
    return add_output_file(
        session,
        tenant=row.tenant,
        batch_id=row.id,
        filename=f"{row.id}_{kind}.jsonl",
        size=size,
        now=now,
        expires_at=row.output_expires_at,
    )
