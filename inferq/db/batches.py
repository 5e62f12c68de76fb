"""The batch store: every SQL statement about batches and their jobs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from inferq.batch_lines import LineSpec
from inferq.batches import (
    BATCH_ID_PREFIX,
    Batch,
    BatchStatus,
    BatchUsage,
    LineError,
    RequestCounts,
    ResultRow,
)
from inferq.constants import BULK_QUEUE
from inferq.db.bulk import insert_rows
from inferq.db.jobs import new_job_row
from inferq.db.models import BatchRow, JobRow
from inferq.db.outbox import enqueue_batch_event, ensure_endpoint, wake_delivery
from inferq.db.support import as_utc, translate_errors, utcnow
from inferq.exceptions import InvalidState, NotFound
from inferq.ids import new_id
from inferq.jobs import ACTIVE_STATUSES, JobStatus
from inferq.webhooks import WebhookRequest

INSERT_EVERY = 1000
PUBLISH_CHUNK = 4096
_ACTIVE = [s.value for s in ACTIVE_STATUSES]
_FINALIZABLE = [
    BatchStatus.IN_PROGRESS.value,
    BatchStatus.FINALIZING.value,
    BatchStatus.CANCELLING.value,
]


@dataclass(frozen=True, kw_only=True)
class NewBatch:
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    window: timedelta
    model: str
    metadata: dict[str, str] = field(default_factory=dict)
    webhook: WebhookRequest | None = None
    # Every line's priority (inferq.jobs.MAX_PRIORITY).
    priority: int = 0


class BatchStore:
    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        clock: Callable[[], datetime] = utcnow,
        on_webhooks: Callable[[], None] | None = None,
    ) -> None:
        """`on_webhooks`: as for `JobStore`, called after a commit that queued a delivery."""
        self._sessions = sessions
        self._clock = clock
        self._on_webhooks = on_webhooks

    @translate_errors
    def create(
        self,
        new: NewBatch,
        lines: Iterable[LineSpec | LineError],
        *,
        requeue_after_s: int,
        max_errors: int,
        then: Callable[[Session, Batch], None] | None = None,
    ) -> Batch:
        """Write the batch and a job per line in one transaction, a thousand rows at a
        time. If any line is refused, nothing but the failed batch (with the errors) is
        written."""
        batch_id = new_id(BATCH_ID_PREFIX)
        now = self._clock()
        errors: list[LineError] = []
        refused = 0
        try:
            with self._sessions.begin() as session:
                values = _batch_values(session, batch_id, new, now)
                session.execute(insert(BatchRow).values(**values))
                rows: list[dict[str, Any]] = []
                for item in lines:
                    if isinstance(item, LineError):
                        refused += 1
                        errors += [item] if len(errors) < max_errors else []
                    elif not errors:  # after a refusal, lines are still checked, not written
                        rows.append(_job_values(item, batch_id, new, now, requeue_after_s))
                        rows = _flush(session, rows, at=INSERT_EVERY)
                if errors:
                    raise _LinesRefused
                _flush(session, rows, at=1)
                row = session.get(BatchRow, batch_id)
                assert row is not None
                row.status, row.in_progress_at = BatchStatus.IN_PROGRESS.value, self._clock()
                batch = _batch_from_row(row)
                if then is not None:
                    then(session, batch)
                return batch
        except _LinesRefused:
            pass  # the transaction rolled back: no job of this batch was written
        if refused > len(errors):
            errors.append(
                LineError(
                    code="too_many_errors",
                    message=f"{refused - len(errors)} more lines were refused; "
                    f"only the first {max_errors} are listed",
                )
            )
        return self.create_failed(new, errors, then=then, batch_id=batch_id, created_at=now)

    @translate_errors
    def create_failed(
        self,
        new: NewBatch,
        errors: Sequence[LineError],
        *,
        then: Callable[[Session, Batch], None] | None = None,
        batch_id: str | None = None,
        created_at: datetime | None = None,
    ) -> Batch:
        """A batch refused as a whole (its file broke a limit, or a line was invalid)."""
        now = self._clock()
        with self._sessions.begin() as session:
            values = _batch_values(
                session, batch_id or new_id(BATCH_ID_PREFIX), new, created_at or now
            )
            values.update(
                status=BatchStatus.FAILED.value,
                failed_at=now,
                errors=[e.to_dict() for e in errors],
            )
            session.execute(insert(BatchRow).values(**values))
            row = session.get(BatchRow, values["id"])
            assert row is not None
            batch = _batch_from_row(row)
            queued = enqueue_batch_event(session, row, now)
            if then is not None:
                then(session, batch)
        wake_delivery(self._on_webhooks, queued)
        return batch

    @translate_errors
    def get(self, batch_id: str, *, scope: str | None = None) -> Batch:
        with self._sessions.begin() as session:
            row = _scoped(session, batch_id, scope)
            return _with_counts(session, _batch_from_row(row))

    @translate_errors
    def page(
        self, *, scope: str | None, after: str | None = None, limit: int = 20
    ) -> tuple[list[Batch], bool]:
        query = select(BatchRow).order_by(BatchRow.id.desc()).limit(limit + 1)
        if scope is not None:
            query = query.where(BatchRow.tenant == scope)
        if after is not None:
            query = query.where(BatchRow.id < after)
        with self._sessions.begin() as session:
            rows = session.scalars(query).all()
            batches = [_with_counts(session, _batch_from_row(r)) for r in rows[:limit]]
            return batches, len(rows) > limit

    @translate_errors
    def job_id_chunks(
        self, batch_id: str, *, statuses: Sequence[JobStatus] = (JobStatus.QUEUED,)
    ) -> Iterator[list[str]]:
        """The batch's job ids in `statuses` (queued ones by default), in line order, in
        chunks (for publishing)."""
        last = 0
        while True:
            with self._sessions.begin() as session:
                rows = session.execute(
                    select(JobRow.id, JobRow.line)
                    .where(JobRow.batch_id == batch_id, JobRow.line > last)
                    .where(JobRow.status.in_([status.value for status in statuses]))
                    .order_by(JobRow.line)
                    .limit(PUBLISH_CHUNK)
                ).all()
            if not rows:
                return
            last = rows[-1].line
            yield [row.id for row in rows]

    @translate_errors
    def stop(
        self, batch_id: str, *, scope: str | None = None, code: str, message: str
    ) -> tuple[Batch, list[str]]:
        """Cancel (or expire) a batch: every line not yet finished ends now with `code`.
        Returns the batch and the ids of the lines that were running, to abort them."""
        now = self._clock()
        with self._sessions.begin() as session:
            row = _scoped(session, batch_id, scope, for_update=True)
            if row.status not in (BatchStatus.IN_PROGRESS.value, BatchStatus.VALIDATING.value):
                raise InvalidState(
                    f"batch {batch_id} is {row.status}: only a batch in progress can be stopped"
                )
            running = list(
                session.scalars(
                    select(JobRow.id).where(
                        JobRow.batch_id == batch_id, JobRow.status == JobStatus.RUNNING.value
                    )
                )
            )
            session.execute(
                update(JobRow)
                .where(JobRow.batch_id == batch_id, JobRow.status.in_(_ACTIVE))
                .values(
                    status=JobStatus.CANCELLED.value,
                    finished_at=now,
                    lease_expires_at=None,
                    error={"code": code, "message": message},
                )
                .execution_options(synchronize_session=False)
            )
            if code == "batch_expired":
                row.expired_at = now
            else:
                row.status, row.cancelling_at = BatchStatus.CANCELLING.value, now
            return _with_counts(session, _batch_from_row(row)), running

    @translate_errors
    def expired(self, *, limit: int = 100) -> list[str]:
        """Batches in progress whose completion window has run out."""
        with self._sessions.begin() as session:
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

    @translate_errors
    def finished(self, batch_ids: Sequence[str] | None = None) -> list[str]:
        """Batches (of these, or any) whose lines have all ended but are not finalized."""
        active = exists().where(JobRow.batch_id == BatchRow.id, JobRow.status.in_(_ACTIVE))
        query = select(BatchRow.id).where(BatchRow.status.in_(_FINALIZABLE), ~active)
        if batch_ids is not None:
            query = query.where(BatchRow.id.in_(batch_ids))
        with self._sessions.begin() as session:
            return list(session.scalars(query.limit(1000)))

    @translate_errors
    def start_finalizing(self, batch_id: str) -> Batch | None:
        """Mark a batch whose lines have all ended as finalizing; None if it is not ready
        (lines still active) or already final."""
        with self._sessions.begin() as session:
            row = session.get(BatchRow, batch_id, with_for_update=True)
            if row is None or row.status not in _FINALIZABLE:
                return None
            active = session.scalar(
                select(exists().where(JobRow.batch_id == batch_id, JobRow.status.in_(_ACTIVE)))
            )
            if active:
                return None
            if row.status == BatchStatus.IN_PROGRESS.value:
                row.status = BatchStatus.FINALIZING.value
            row.finalizing_at = row.finalizing_at or self._clock()
            return _with_counts(session, _batch_from_row(row))

    @translate_errors
    def finish_finalizing(
        self,
        batch_id: str,
        *,
        add_files: Callable[[Session, Batch], tuple[str | None, str | None]],
        then: Callable[[Session, Batch], None] | None = None,
    ) -> Batch | None:
        """Record the output files and end the batch: completed, cancelled or expired."""
        now = self._clock()
        with self._sessions.begin() as session:
            row = session.get(BatchRow, batch_id, with_for_update=True)
            if row is None or row.status not in _FINALIZABLE:
                return None
            row.output_file_id, row.error_file_id = add_files(session, _batch_from_row(row))
            if row.status == BatchStatus.CANCELLING.value:
                row.status, row.cancelled_at = BatchStatus.CANCELLED.value, now
            elif row.expired_at is not None:
                row.status = BatchStatus.EXPIRED.value
            else:
                row.status, row.completed_at = BatchStatus.COMPLETED.value, now
            batch = _with_counts(session, _batch_from_row(row))
            queued = enqueue_batch_event(session, row, now)
            if then is not None:
                then(session, batch)
        wake_delivery(self._on_webhooks, queued)
        return batch

    def results(self, batch_id: str, *, errors: bool) -> Iterator[ResultRow]:
        """A batch's succeeded lines (or, with `errors`, the others) in line order,
        read through a server-side cursor a thousand rows at a time."""
        wanted = (
            [JobStatus.FAILED.value, JobStatus.CANCELLED.value]
            if errors
            else [JobStatus.SUCCEEDED.value]
        )
        query = (
            select(
                JobRow.id,
                JobRow.line,
                JobRow.custom_id,
                JobRow.status,
                JobRow.choices,
                JobRow.prompt_tokens,
                JobRow.completion_tokens,
                JobRow.error,
                JobRow.finished_at,
            )
            .where(JobRow.batch_id == batch_id, JobRow.status.in_(wanted))
            .order_by(JobRow.line)
            .execution_options(yield_per=INSERT_EVERY)
        )
        with self._sessions() as session:
            for row in session.execute(query):
                yield ResultRow(
                    job_id=row.id,
                    line=row.line,
                    custom_id=row.custom_id,
                    status=JobStatus(row.status),
                    choices=row.choices,
                    prompt_tokens=row.prompt_tokens,
                    completion_tokens=row.completion_tokens,
                    error=row.error,
                    finished_at=as_utc(row.finished_at),
                )


def _flush(session: Session, rows: list[dict[str, Any]], *, at: int) -> list[dict[str, Any]]:
    """Insert the buffered job rows once there are `at` of them; return what stays."""
    if not rows or len(rows) < at:
        return rows
    insert_rows(session, JobRow, rows)
    return []


class _LinesRefused(Exception):
    """Some line was refused: roll the batch's jobs back."""


def _batch_values(session: Session, batch_id: str, new: NewBatch, now: datetime) -> dict[str, Any]:
    webhook = {}
    if new.webhook is not None:
        webhook = {
            "webhook_endpoint_id": ensure_endpoint(
                session, tenant=new.tenant, url=new.webhook.url, now=now
            ),
            "webhook_events": new.webhook.events,
        }
    return {
        **webhook,
        "id": batch_id,
        "tenant": new.tenant,
        "endpoint": new.endpoint,
        "input_file_id": new.input_file_id,
        "completion_window": new.completion_window,
        "status": BatchStatus.VALIDATING.value,
        "model": new.model,
        "metadata_": new.metadata,
        "created_at": now,
        "expires_at": now + new.window,
        "priority": new.priority,
    }


def _job_values(
    item: LineSpec, batch_id: str, new: NewBatch, now: datetime, requeue_after_s: int
) -> dict[str, Any]:
    row = new_job_row(
        item.spec, tenant=new.tenant, queue=BULK_QUEUE, now=now, requeue_after_s=requeue_after_s
    )
    row.update(
        metadata_={},
        batch_id=batch_id,
        line=item.line,
        custom_id=item.custom_id,
        priority=new.priority,
    )
    return row


def _scoped(
    session: Session, batch_id: str, scope: str | None, *, for_update: bool = False
) -> BatchRow:
    row = session.get(BatchRow, batch_id, with_for_update=for_update)
    if row is None or (scope is not None and row.tenant != scope):
        raise NotFound(f"no batch with id {batch_id!r}")
    return row


def _with_counts(session: Session, batch: Batch) -> Batch:
    rows = session.execute(
        select(
            JobRow.status,
            func.count(),
            func.coalesce(func.sum(JobRow.prompt_tokens), 0),
            func.coalesce(func.sum(JobRow.completion_tokens), 0),
        )
        .where(JobRow.batch_id == batch.id)
        .group_by(JobRow.status)
    ).all()
    by_status = {status: (count, prompt, completion) for status, count, prompt, completion in rows}
    done = by_status.get(JobStatus.SUCCEEDED.value, (0, 0, 0))
    failed = sum(
        by_status.get(s, (0, 0, 0))[0] for s in (JobStatus.FAILED.value, JobStatus.CANCELLED.value)
    )
    return replace(
        batch,
        counts=RequestCounts(
            total=sum(v[0] for v in by_status.values()), completed=done[0], failed=failed
        ),
        usage=BatchUsage(input_tokens=int(done[1] or 0), output_tokens=int(done[2] or 0)),
    )


def _batch_from_row(row: BatchRow) -> Batch:
    def ts(value: datetime | None) -> datetime | None:
        return as_utc(value)

    created_at, expires_at = ts(row.created_at), ts(row.expires_at)
    assert created_at is not None
    assert expires_at is not None
    return Batch(
        id=row.id,
        tenant=row.tenant,
        endpoint=row.endpoint,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=BatchStatus(row.status),
        created_at=created_at,
        expires_at=expires_at,
        metadata=row.metadata_,
        errors=tuple(LineError(**e) for e in row.errors or ()),
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        in_progress_at=ts(row.in_progress_at),
        finalizing_at=ts(row.finalizing_at),
        completed_at=ts(row.completed_at),
        failed_at=ts(row.failed_at),
        expired_at=ts(row.expired_at),
        cancelling_at=ts(row.cancelling_at),
        cancelled_at=ts(row.cancelled_at),
        model=row.model,
        priority=row.priority,
    )
