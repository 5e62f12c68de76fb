"""The batch store: every SQL statement about batches and their jobs lives here or in
`inferq.store.batch_endings` (stopping and finalizing), which it is built on."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, func, insert, or_, select
from sqlalchemy.orm import Session

from inferq.domain.batches import (
    BATCH_ID_PREFIX,
    Batch,
    BatchStatus,
    LineError,
    ResultRow,
    max_output_tokens,
)
from inferq.domain.jobs import TERMINAL_STATUSES, JobStatus
from inferq.domain.queue_names import bulk_queue
from inferq.domain.usage import Usage, UsageKey, hour_of
from inferq.ids import new_id
from inferq.store.base import Page, newest_first
from inferq.store.batch_endings import BatchEndings
from inferq.store.batch_rows import (
    RESULT_COLUMNS,
    RESULT_EXTRAS,
    NewBatch,
    batch_from_row,
    new_batch_row,
    output_expiry,
    result_row,
    scoped_batch,
)
from inferq.store.bulk import insert_rows
from inferq.store.idempotency import record_response
from inferq.store.job_rows import ACTIVE, BatchPlace, new_job_row
from inferq.store.models import BatchRow, JobRow
from inferq.store.outbox import enqueue_batch_event, ensure_endpoint
from inferq.store.usage import Demand, add_usage, refuse_over_quota
from inferq.wire.batch_lines import LineSpec

INSERT_EVERY = 1000
PUBLISH_CHUNK = 4096
# Lines read at once for a batch's output: a page, then the next after its last line.
RESULTS_PAGE = 2000
# A batch of this many lines has the jobs table's statistics read again once written: of
# the columns claims, flushes and maintenance choose rows by (the others, prompts and
# results, cost most of the time to analyse).
ANALYZE_AFTER_LINES = 1000
PLANNED_COLUMNS = ("id", "status", "queue", "batch_id", "line", "tenant", "key_id")

# Renders a new batch as the body of its response, to remember for an idempotent request.
Respond = Callable[[Batch], dict[str, Any]]


class BatchStore(BatchEndings):
    """Reads and writes batches: created, read and their lines listed here; stopped and
    finalized in `BatchEndings`."""

    def create(
        self,
        new: NewBatch,
        lines: Iterable[LineSpec | LineError],
        *,
        requeue_after_s: int,
        max_errors: int,
        respond: Respond | None = None,
    ) -> Batch:
        """Write the batch and a job per line in one transaction, a thousand rows at a
        time. If any line is refused, nothing but the failed batch (with the errors) is
        written. A batch created under an idempotency key has its response
        (`respond(batch)`) remembered in the same transaction."""
        batch_id = new_id(BATCH_ID_PREFIX)
        now = self._clock()
        errors: list[LineError] = []
        refused = written = prompt_tokens = max_tokens = longest = 0
        try:
            with self._transaction() as session:
                session.execute(insert(BatchRow).values(**_batch_row(session, new, batch_id, now)))
                rows: list[dict[str, Any]] = []
                for item in lines:
                    if isinstance(item, LineError):
                        refused += 1
                        errors += [item] if len(errors) < max_errors else []
                    elif not errors:  # after a refusal, lines are still checked, not written
                        rows.append(_line_row(item, batch_id, new, now, requeue_after_s))
                        written += 1
                        prompt_tokens += len(item.spec.prompt_token_ids)
                        line_tokens = max_output_tokens(item.spec.sampling)
                        max_tokens += line_tokens
                        longest = max(longest, line_tokens)
                        rows = _flush(session, rows, at=INSERT_EVERY)
                if errors:
                    raise _LinesRefused
                _flush(session, rows, at=1)
                _count_batch(session, new, batch_id, tokens=prompt_tokens + max_tokens, now=now)
                row = session.get(BatchRow, batch_id)
                assert row is not None
                row.status, row.in_progress_at = BatchStatus.IN_PROGRESS.value, self._clock()
                row.request_total = written
                row.line_prompt_tokens, row.line_max_tokens = prompt_tokens, max_tokens
                row.line_longest_tokens = longest
                batch = batch_from_row(row)
                _remember(session, new, batch, respond)
            self._analyze_jobs(written)
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
        return self.create_failed(new, errors, respond=respond, batch_id=batch_id, created_at=now)

    def _analyze_jobs(self, written: int) -> None:
        """After a batch of `written` lines: if that many changed the jobs table's shape,
        have Postgres read its statistics again now, not at autovacuum's next look (up to
        a minute): planned on the old ones (few queued jobs), a claim or a flush reads
        every queued job of the queue through a partial index instead of its own rows."""
        if written < ANALYZE_AFTER_LINES or not self._postgres:
            return
        with self._statement() as connection:
            connection.exec_driver_sql(f"ANALYZE jobs ({', '.join(PLANNED_COLUMNS)})")

    def create_failed(
        self,
        new: NewBatch,
        errors: Sequence[LineError],
        *,
        respond: Respond | None = None,
        batch_id: str | None = None,
        created_at: datetime | None = None,
    ) -> Batch:
        """A batch refused as a whole (its file broke a limit, or a line was invalid)."""
        now = self._clock()
        batch_id = batch_id or new_id(BATCH_ID_PREFIX)
        with self._transaction() as session:
            values = _batch_row(session, new, batch_id, created_at or now)
            values.update(
                status=BatchStatus.FAILED.value,
                failed_at=now,
                errors=[e.to_dict() for e in errors],
            )
            session.execute(insert(BatchRow).values(**values))
            row = session.get(BatchRow, batch_id)
            assert row is not None
            row.output_expires_at = output_expiry(row, now)
            batch = batch_from_row(row)
            queued = enqueue_batch_event(session, row, now)
            _remember(session, new, batch, respond)
        self._wake_delivery(queued)
        return batch

    def get(self, batch_id: str, *, scope: str | None = None) -> Batch:
        with self._transaction() as session:
            return batch_from_row(scoped_batch(session, batch_id, scope, self._clock()))

    def page(
        self,
        *,
        scope: str | None,
        after: str | None = None,
        limit: int = 20,
        endpoint: str | None = None,
    ) -> Page[Batch]:
        """A page of batches, newest first; with `endpoint`, only that endpoint's, and
        none that was refused (Anthropic's batches: a refused one never had an id)."""
        now = self._clock()
        query = select(BatchRow).where(
            or_(BatchRow.output_expires_at.is_(None), BatchRow.output_expires_at > now)
        )
        if scope is not None:
            query = query.where(BatchRow.tenant == scope)
        if endpoint is not None:
            query = query.where(
                BatchRow.endpoint == endpoint, BatchRow.status != BatchStatus.FAILED.value
            )
        with self._transaction() as session:
            return newest_first(
                session,
                query,
                BatchRow.id,
                after=after,
                limit=limit,
                convert=lambda rows: [batch_from_row(r) for r in rows],
            )

    def job_id_chunks(
        self, batch_id: str, *, statuses: Sequence[JobStatus] = (JobStatus.QUEUED,)
    ) -> Iterator[list[str]]:
        """The batch's job ids in `statuses` (queued ones by default), in line order, in
        chunks (for publishing)."""
        for rows in self._line_chunks(batch_id, statuses):
            yield [row.id for row in rows]

    def queued_by_queue(self, batch_id: str) -> Iterator[tuple[str, list[str]]]:
        """The batch's queued job ids in line order, in chunks of one queue each (for
        publishing): `(queue, ids)`."""
        for rows in self._line_chunks(batch_id, (JobStatus.QUEUED,)):
            by_queue: dict[str, list[str]] = {}
            for row in rows:
                by_queue.setdefault(row.queue, []).append(row.id)
            yield from by_queue.items()

    def _line_chunks(self, batch_id: str, statuses: Sequence[JobStatus]) -> Iterator[list[Any]]:
        """The id, line and queue of the batch's jobs in `statuses`, in line order, a
        chunk per transaction."""
        last = 0
        while True:
            with self._transaction() as session:
                rows = session.execute(
                    select(JobRow.id, JobRow.line, JobRow.queue)
                    .where(JobRow.batch_id == batch_id, JobRow.line > last)
                    .where(JobRow.status.in_([status.value for status in statuses]))
                    .order_by(JobRow.line)
                    .limit(PUBLISH_CHUNK)
                ).all()
            if not rows:
                return
            last = rows[-1].line
            yield list(rows)

    def first_active_line(self, batch_id: str, *, after: int = 0) -> int | None:
        """The first line of the batch after `after` still queued or running; None once all
        of them have ended. The lines are walked in order from `after` (an index), so it
        reads about as many rows as have ended since."""
        with self._transaction() as session:
            return session.scalar(
                select(JobRow.line)
                .where(
                    JobRow.batch_id == batch_id,
                    JobRow.line > after,
                    JobRow.status.in_(ACTIVE),
                )
                .order_by(JobRow.line)
                .limit(1)
            )

    def last_line(self, batch_id: str) -> int | None:
        """The number of the batch's last line; None if it has none (it was refused)."""
        with self._transaction() as session:
            return session.scalar(select(func.max(JobRow.line)).where(JobRow.batch_id == batch_id))

    def outcomes(self, batch_id: str) -> dict[tuple[JobStatus, str | None], int]:
        """How many of the batch's lines ended in each status, with each error code."""
        code = JobRow.error["code"].as_string()
        with self._transaction() as session:
            rows = session.execute(
                select(JobRow.status, code, func.count())
                .where(
                    JobRow.batch_id == batch_id,
                    JobRow.status.in_([s.value for s in TERMINAL_STATUSES]),
                )
                .group_by(JobRow.status, code)
            ).all()
        return {(JobStatus(status), error): count for status, error, count in rows}

    def results(
        self,
        batch_id: str,
        *,
        errors: bool | None,
        after: int = 0,
        before: int | None = None,
        extras: bool = True,
    ) -> Iterator[ResultRow]:
        """A batch's succeeded lines (with `errors`, the failed and cancelled ones; with
        None, every line that has ended) numbered after `after` and before `before`, in
        line order, read a page of `RESULTS_PAGE` at a time (each read on its own: lines
        that have ended do not change). `extras`: with what embeddings and responses need
        besides (`RESULT_EXTRAS`)."""
        if errors is None:
            wanted = [status.value for status in TERMINAL_STATUSES]
        elif errors:
            wanted = [JobStatus.FAILED.value, JobStatus.CANCELLED.value]
        else:
            wanted = [JobStatus.SUCCEEDED.value]
        columns = (*RESULT_COLUMNS, *RESULT_EXTRAS) if extras else RESULT_COLUMNS
        query = (
            select(*columns)
            .where(
                JobRow.batch_id == batch_id,
                JobRow.status.in_(wanted),
                JobRow.line > bindparam("after"),
            )
            .order_by(JobRow.line)
            .limit(RESULTS_PAGE)
        )
        if before is not None:
            query = query.where(JobRow.line < before)
        while True:
            with self._statement() as connection:
                page = connection.execute(query, {"after": after}).all()
            yield from (result_row(row, extras=extras) for row in page)
            if len(page) < RESULTS_PAGE:
                return
            after = page[-1].line


class _LinesRefused(Exception):
    """Some line was refused: roll the batch's jobs back."""


def _batch_row(session: Session, new: NewBatch, batch_id: str, now: datetime) -> dict[str, Any]:
    endpoint_id = None
    if new.webhook is not None:
        endpoint_id = ensure_endpoint(session, tenant=new.tenant, url=new.webhook.url, now=now)
    return new_batch_row(new, batch_id=batch_id, now=now, webhook_endpoint_id=endpoint_id)


def _line_row(
    item: LineSpec, batch_id: str, new: NewBatch, now: datetime, requeue_after_s: int
) -> dict[str, Any]:
    place = BatchPlace(batch_id, item.line, item.custom_id, new.priority)
    return new_job_row(
        item.spec,
        tenant=new.tenant,
        queue=bulk_queue(item.spec.served_by),
        now=now,
        requeue_after_s=requeue_after_s,
        key_id=new.key_id,
        place=place,
    )


def _count_batch(
    session: Session, new: NewBatch, batch_id: str, *, tokens: int, now: datetime
) -> None:
    """Check the whole batch against its key's quota (`QuotaExceeded` rolls it back), and
    count it in its key's usage."""
    if new.quota and new.key_id is not None:
        (refusal,) = refuse_over_quota(
            session, [Demand(new.key_id, tokens)], now=now, excluding_batch=batch_id
        )
        if refusal is not None:
            raise refusal
    key = UsageKey(new.tenant, new.key_id or "", new.model or "", hour_of(now))
    add_usage(session, {key: Usage(batches=1)})


def _flush(session: Session, rows: list[dict[str, Any]], *, at: int) -> list[dict[str, Any]]:
    """Insert the buffered job rows once there are `at` of them; return what stays."""
    if not rows or len(rows) < at:
        return rows
    insert_rows(session, JobRow, rows)
    return []


def _remember(session: Session, new: NewBatch, batch: Batch, respond: Respond | None) -> None:
    if new.idempotency is not None:
        assert respond is not None, "an idempotent batch needs `respond`"
        record_response(session, new.idempotency, status_code=200, body=respond(batch))
