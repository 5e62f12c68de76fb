"""What can be done to a batch: create it from a file, read and list, cancel it, expire
it, finalize it, and read its files. Used by the API, the maintenance worker and
`inferq run`."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from inferq.broker.celery_app import JobPublisher
from inferq.broker.events import JobEvents
from inferq.domain.batches import (
    Batch,
    FilePurpose,
    LineError,
    ResultRow,
    StoredFile,
    parse_completion_window,
)
from inferq.domain.jobs import JobStatus
from inferq.domain.webhooks import WebhookRequest
from inferq.exceptions import BrokerUnavailable, InvalidRequest, NotFound
from inferq.store.base import Page
from inferq.store.batch_rows import NewBatch
from inferq.store.batches import BatchStore, Respond
from inferq.store.files import FileSize, FileStore
from inferq.store.idempotency import IdempotentRequest
from inferq.wire.batch_lines import BatchLineReader, LineSpec
from inferq.wire.batch_output import render
from inferq.wire.model_catalog import ModelCatalog
from inferq.wire.public import batch_json

log = logging.getLogger(__name__)

MAX_LISTED_ERRORS = 100


@dataclass(frozen=True, kw_only=True)
class PartialOutput:
    """Rendered `lines` of a batch that have ended since a cursor; every line up to
    `cursor` has ended and is covered (ask again after it); `ended`: so has every line."""

    cursor: int
    ended: bool
    lines: Iterator[bytes]


class BatchOperations:
    def __init__(
        self,
        *,
        files: FileStore,
        batches: BatchStore,
        models: ModelCatalog | None,
        publisher: JobPublisher | None,
        events: JobEvents | None,
        max_lines: int,
        requeue_after_s: int,
        respond: Respond = batch_json,
    ) -> None:
        """`respond` renders a new batch as the body of its response, to be remembered
        for an idempotent request."""
        self.files = files
        self.batches = batches
        self._models = models
        self._publisher = publisher
        self._events = events
        self._max_lines = max_lines
        self._requeue_after_s = requeue_after_s
        self._respond = respond

    def create(
        self,
        *,
        tenant: str,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str],
        webhook: WebhookRequest | None = None,
        priority: int = 0,
        idempotency: IdempotentRequest | None = None,
        output_expires_after_s: int | None = None,
    ) -> Batch:
        """Check every line of the file and queue a job per line, or fail the batch with
        the refused lines listed. Nothing is half-written either way; the response to a
        request with an idempotency key is remembered with what it wrote. Once it ends,
        its lines, results and files are kept `output_expires_after_s` (None: kept)."""
        assert self._models is not None, "creating batches needs the served models"
        window = parse_completion_window(completion_window)
        try:
            source = self.files.get(input_file_id, scope=tenant)
        except NotFound as exc:
            raise InvalidRequest(exc.message, param="input_file_id") from exc
        if source.purpose is not FilePurpose.BATCH:
            raise InvalidRequest(
                f"file {input_file_id} has purpose {source.purpose}, not 'batch'",
                param="input_file_id",
            )
        new = NewBatch(
            tenant=tenant,
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            window=window,
            model=None,
            metadata=metadata,
            webhook=webhook,
            priority=priority,
            idempotency=idempotency,
            output_expires_after_s=output_expires_after_s,
        )
        if source.lines > self._max_lines:
            error = LineError(
                code="too_many_lines",
                message=f"the file has {source.lines} lines, over the limit of "
                f"{self._max_lines}: split it into several batches",
            )
            return self.batches.create_failed(new, [error], respond=self._respond)
        reader = BatchLineReader(self._models, endpoint=endpoint)
        lines = reader.read(self.files.lines(input_file_id))
        first = next(lines, None)
        if isinstance(first, LineSpec):  # a batch's `model` is its first line's
            new = dataclasses.replace(new, model=first.spec.model)
        if first is None:
            error = LineError(
                code="empty_file",
                message=f"file {input_file_id} has no requests (only blank lines): put one "
                "JSON request per line",
            )
            return self.batches.create_failed(new, [error], respond=self._respond)
        batch = self.batches.create(
            new,
            itertools.chain([first], lines),
            requeue_after_s=self._requeue_after_s,
            max_errors=MAX_LISTED_ERRORS,
            respond=self._respond,
        )
        if batch.errors:
            return batch
        self._publish(batch)
        return self.batches.get(batch.id)

    def get(self, batch_id: str, *, scope: str | None) -> Batch:
        return self.batches.get(batch_id, scope=scope)

    def page(self, *, scope: str | None, after: str | None, limit: int) -> Page[Batch]:
        return self.batches.page(scope=scope, after=after, limit=limit)

    def cancel(self, batch_id: str, *, scope: str | None) -> Batch:
        """Stop a batch: finished lines stay, the rest never run (running ones are aborted)."""
        batch, running = self.batches.stop(
            batch_id,
            scope=scope,
            code="batch_cancelled",
            message="the batch was cancelled before this line ran",
        )
        self._after_stop(batch.id, running)
        return self.batches.get(batch.id)

    def expire_due(self) -> list[str]:
        """Expire batches past their completion window; return their ids."""
        expired = []
        for batch_id in self.batches.expired():
            _, running = self.batches.stop(
                batch_id,
                code="batch_expired",
                message="the batch expired before this line ran",
            )
            self._after_stop(batch_id, running)
            expired.append(batch_id)
        return expired

    def finalize(self, batch_id: str) -> Batch | None:
        """If every line has ended: make the output and error files and end the batch."""
        batch = self.batches.start_finalizing(batch_id)
        if batch is None:
            return None
        return self.batches.finish_finalizing(
            batch_id,
            output=_measure(self._rendered(batch, errors=False)),
            errors=_measure(self._rendered(batch, errors=True)),
        )

    def content(self, file: StoredFile) -> Iterator[bytes]:
        """A file's bytes, streamed: stored chunks, or a batch's results rendered now."""
        if file.purpose is FilePurpose.BATCH or file.batch_id is None:
            return self.files.chunks(file.id)
        batch = self.batches.get(file.batch_id)
        return self._rendered(batch, errors=file.id == batch.error_file_id)

    def partial_output(self, batch: Batch, *, after: int, include_errors: bool) -> PartialOutput:
        """The lines numbered after `after` that have ended, up to the first still queued
        or running, rendered as in the batch's output file (and, with `include_errors`,
        its error file, interleaved in input order). Lines never come back to queued once
        ended, so going on from the cursor neither misses nor repeats one."""
        first_active = self.batches.first_active_line(batch.id)
        if first_active is None:
            cursor = max(after, self.batches.last_line(batch.id) or 0)
        else:
            cursor = max(after, first_active - 1)
        rows = self.batches.results(
            batch.id, errors=None if include_errors else False, after=after, before=first_active
        )
        return PartialOutput(
            cursor=cursor,
            ended=first_active is None,
            lines=_interleaved(rows, endpoint=batch.endpoint),
        )

    def _rendered(self, batch: Batch, *, errors: bool) -> Iterator[bytes]:
        """The batch's output file (or, with `errors`, its error file), made from its
        results."""
        return render(
            self.batches.results(batch.id, errors=errors),
            errors=errors,
            endpoint=batch.endpoint,
        )

    def _publish(self, batch: Batch) -> None:
        if self._publisher is None:
            return
        try:
            for queue, job_ids in self.batches.queued_by_queue(batch.id):
                self._publisher.publish_bulk(job_ids, queue=queue)
        except BrokerUnavailable as exc:
            # The jobs are safe in Postgres: maintenance publishes those not yet taken.
            log.warning("batch %s is stored but not all published: %s", batch.id, exc.message)

    def _after_stop(self, batch_id: str, running: list[str]) -> None:
        if self._events is not None:
            self._events.cancelled(running)
        if self._publisher is not None:
            try:
                self._publisher.publish_finalize(batch_id)
                return
            except BrokerUnavailable:
                pass  # maintenance's sweep finalizes it
        self.finalize(batch_id)


def _interleaved(rows: Iterable[ResultRow], *, endpoint: str) -> Iterator[bytes]:
    """Succeeded lines as in an output file, the others as in an error file."""
    for failed, run in itertools.groupby(rows, key=lambda row: row.status != JobStatus.SUCCEEDED):
        yield from render(run, errors=failed, endpoint=endpoint)


def _measure(chunks: Iterator[bytes]) -> FileSize:
    size = lines = 0
    for chunk in chunks:
        size += len(chunk)
        lines += 1
    return FileSize(size, lines)
