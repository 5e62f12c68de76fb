"""The retention store: every statement that deletes what has outlived its keep.

Each call is one statement in its own short transaction, over at most `limit` rows, so no
statement holds locks on a hot table for long; the caller repeats it until a call deletes
fewer than it may. Each returns how many rows it deleted.

Expired things are hidden before they are deleted: a file, or a batch's output, past its
expiry already answers 404 (see `inferq.store.files` and `inferq.store.batches`), so deleting a
big batch over many statements never shows half of it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Delete, delete, exists, select, tuple_

from inferq.domain.jobs import TERMINAL_STATUSES
from inferq.store.base import Store
from inferq.store.models import (
    BatchRow,
    FileChunkRow,
    FileRow,
    IdempotencyKeyRow,
    JobRow,
    WebhookDeliveryRow,
)

_TERMINAL = [s.value for s in TERMINAL_STATUSES]


class RetentionStore(Store):
    def delete_ended_jobs(self, *, ended_before: datetime, limit: int) -> int:
        """Single jobs (not batch lines) that ended before `ended_before`."""
        ids = (
            select(JobRow.id)
            .where(
                JobRow.batch_id.is_(None),
                JobRow.finished_at.is_not(None),
                JobRow.finished_at < ended_before,
                JobRow.status.in_(_TERMINAL),
            )
            .limit(limit)
        )
        return self._delete(delete(JobRow).where(JobRow.id.in_(ids.scalar_subquery())))

    def expired_batches(self, *, now: datetime, limit: int) -> list[str]:
        """Batches whose output expired: their lines, results and files are to go."""
        with self._transaction() as session:
            return list(
                session.scalars(
                    select(BatchRow.id)
                    .where(BatchRow.output_expires_at < now)
                    .order_by(BatchRow.output_expires_at)
                    .limit(limit)
                )
            )

    def delete_batch_lines(self, batch_id: str, *, limit: int) -> int:
        ids = select(JobRow.id).where(JobRow.batch_id == batch_id).limit(limit)
        return self._delete(delete(JobRow).where(JobRow.id.in_(ids.scalar_subquery())))

    def delete_batch(self, batch_id: str) -> int:
        """The batch and its output and error files, once its lines are gone."""
        with self._transaction() as session:
            if session.scalar(select(exists().where(JobRow.batch_id == batch_id))):
                return 0
            session.execute(delete(FileRow).where(FileRow.batch_id == batch_id))
            return _count(session.execute(delete(BatchRow).where(BatchRow.id == batch_id)))

    def delete_expired_file_chunks(self, *, now: datetime, limit: int) -> int:
        """Chunks of files past their expiry (the files already answer 404)."""
        chunks = (
            select(FileChunkRow.file_id, FileChunkRow.seq)
            .join(FileRow, FileRow.id == FileChunkRow.file_id)
            .where(FileRow.expires_at < now)
            .limit(limit)
        )
        return self._delete(
            delete(FileChunkRow).where(tuple_(FileChunkRow.file_id, FileChunkRow.seq).in_(chunks))
        )

    def delete_gone_files(self, *, now: datetime, limit: int) -> int:
        """Uploaded files past their expiry whose chunks are gone, and files deleted by
        hand (their chunks went then). A batch's own files go with the batch."""
        gone = (
            select(FileRow.id)
            .where(
                FileRow.batch_id.is_(None),
                (FileRow.expires_at < now) | FileRow.deleted_at.is_not(None),
                ~exists().where(FileChunkRow.file_id == FileRow.id),
            )
            .limit(limit)
        )
        return self._delete(delete(FileRow).where(FileRow.id.in_(gone.scalar_subquery())))

    def delete_ended_deliveries(self, *, ended_before: datetime, limit: int) -> int:
        """Webhook deliveries that ended before `ended_before`, with their attempts."""
        ids = (
            select(WebhookDeliveryRow.id)
            .where(
                WebhookDeliveryRow.finished_at.is_not(None),
                WebhookDeliveryRow.finished_at < ended_before,
            )
            .limit(limit)
        )
        return self._delete(
            delete(WebhookDeliveryRow).where(WebhookDeliveryRow.id.in_(ids.scalar_subquery()))
        )

    def delete_expired_idempotency_keys(self, *, now: datetime, limit: int) -> int:
        keys = (
            select(IdempotencyKeyRow.key_id, IdempotencyKeyRow.key)
            .where(IdempotencyKeyRow.expires_at < now)
            .limit(limit)
        )
        return self._delete(
            delete(IdempotencyKeyRow).where(
                tuple_(IdempotencyKeyRow.key_id, IdempotencyKeyRow.key).in_(keys)
            )
        )

    def _delete(self, statement: Delete) -> int:
        with self._transaction() as session:
            return _count(session.execute(statement.execution_options(synchronize_session=False)))


def _count(result: Any) -> int:
    return int(result.rowcount or 0)
