"""What can be done to a batch: create it from a file, read, list and cancel it (the API
and `inferq run`: `BatchOperations`); expire it when its window ends (maintenance:
`BatchLifecycle`). Its output files are made in `inferq/operations/batch_output.py`."""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from inferq.domain.batches import (
    MAX_COMPLETION_WINDOW,
    Batch,
    BatchStatus,
    FileEstimate,
    FilePurpose,
    LineError,
    StoredFile,
    max_output_tokens,
    parse_completion_window,
)
from inferq.domain.estimates import BatchWork
from inferq.domain.webhooks import WebhookRequest
from inferq.exceptions import BrokerUnavailable, InvalidRequest, NotFound
from inferq.operations.batch_estimates import BatchEstimates
from inferq.operations.batch_output import BatchOutput
from inferq.store.base import Page
from inferq.store.batch_rows import NewBatch
from inferq.store.batches import BatchStore, Respond
from inferq.store.files import FileStore
from inferq.store.idempotency import IdempotentRequest
from inferq.wire.batch_lines import BatchLineReader, LineSpec
from inferq.wire.model_catalog import ModelCatalog
from inferq.wire.public import batch_json

log = logging.getLogger(__name__)

MAX_LISTED_ERRORS = 100


class BatchPublisher(Protocol):
    """Where a batch's lines and its finalizing are published (`JobPublisher`)."""

    def publish_bulk(self, job_ids: Sequence[str], *, queue: str) -> None: ...
    def publish_finalize(self, batch_id: str) -> None: ...


class BatchEvents(Protocol):
    """Who is told of a batch's lines (`JobEvents`): that they were queued (every worker
    of their queue looks for them), and that running ones were cancelled (their workers
    abort them)."""

    def lines_queued(self, queue: str) -> None: ...
    def cancelled(self, job_ids: Sequence[str]) -> None: ...


class BatchOperations:
    def __init__(
        self,
        *,
        files: FileStore,
        batches: BatchStore,
        models: ModelCatalog,
        publisher: BatchPublisher,
        events: BatchEvents,
        output: BatchOutput,
        estimates: BatchEstimates,
        max_lines: int,
        requeue_after_s: int,
        retention_s: int,
        respond: Respond = batch_json,
    ) -> None:
        """`retention_s`: how long an ended batch is kept unless it says (0: kept);
        `respond` renders a new batch as the body of its response, to be remembered for an
        idempotent request."""
        self.files = files
        self.batches = batches
        self._models = models
        self._publisher = publisher
        self._events = events
        self._output = output
        self._estimates = estimates
        self._max_lines = max_lines
        self._requeue_after_s = requeue_after_s
        self._retention_s = retention_s
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
        key_id: str | None = None,
        quota: bool = False,
    ) -> Batch:
        """Check every line of the file and queue a job per line, or fail the batch with
        the refused lines listed. Nothing is half-written either way; the response to a
        request with an idempotency key is remembered with what it wrote. Once it ends,
        its lines, results and files are kept `output_expires_after_s` (None: the
        deployment's retention). `key_id` is the API key creating it; with `quota`, its
        whole file is checked against the key's quota, and `QuotaExceeded` leaves nothing
        written."""
        window = parse_completion_window(completion_window)
        source = self._source(input_file_id, tenant=tenant)
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
            output_expires_after_s=output_expires_after_s
            if output_expires_after_s is not None
            else self._retention_s or None,
            key_id=key_id,
            quota=quota,
        )
        if source.lines > self._max_lines:
            error = self._too_many_lines(source)
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
        self._estimates.refresh(only=batch.id)
        return self.batches.get(batch.id)

    def estimate(self, *, tenant: str, input_file_id: str, endpoint: str) -> FileEstimate:
        """What a batch of this file would hold, and when it would end, were it created
        now: its lines are checked as `create` checks them, and nothing is written."""
        source = self._source(input_file_id, tenant=tenant)
        if source.lines > self._max_lines:
            return FileEstimate(lines=0, model=None, errors=(self._too_many_lines(source),))
        model: str | None = None
        lines = prompt_tokens = max_tokens = longest = refused = 0
        errors: list[LineError] = []
        reader = BatchLineReader(self._models, endpoint=endpoint)
        for item in reader.read(self.files.lines(input_file_id)):
            if isinstance(item, LineError):
                refused += 1
                errors += [item] if len(errors) < MAX_LISTED_ERRORS else []
                continue
            model = model or item.spec.model
            lines += 1
            prompt_tokens += len(item.spec.prompt_token_ids)
            line_tokens = max_output_tokens(item.spec.sampling)
            max_tokens += line_tokens
            longest = max(longest, line_tokens)
        if errors or model is None:
            return FileEstimate(lines=lines, model=model, errors=tuple(errors), refused=refused)
        now = datetime.now(UTC)
        work = BatchWork(
            batch_id="",
            created_at=now,
            tenant=tenant,
            # After every batch of its tenant in progress, as a batch created now would be.
            expires_at=now + MAX_COMPLETION_WINDOW,
            lines=lines,
            ended=0,
            succeeded=0,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            longest_tokens=longest,
            input_tokens=0,
            output_tokens=0,
        )
        return FileEstimate(
            lines=lines, model=model, estimate=self._estimates.of_new(work, model=model)
        )

    def get(self, batch_id: str, *, scope: str | None) -> Batch:
        """A batch; one in progress with its estimate made again from its progress if the
        last was made more than a few seconds ago (`BatchEstimates.follow`)."""
        batch = self.batches.get(batch_id, scope=scope)
        if batch.status is BatchStatus.IN_PROGRESS and self._estimates.follow(batch.id):
            batch = self.batches.get(batch_id, scope=scope)
        return batch

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

    def _source(self, input_file_id: str, *, tenant: str) -> StoredFile:
        try:
            source = self.files.get(input_file_id, scope=tenant)
        except NotFound as exc:
            raise InvalidRequest(exc.message, param="input_file_id") from exc
        if source.purpose is not FilePurpose.BATCH:
            raise InvalidRequest(
                f"file {input_file_id} has purpose {source.purpose}, not 'batch'",
                param="input_file_id",
            )
        return source

    def _too_many_lines(self, source: StoredFile) -> LineError:
        return LineError(
            code="too_many_lines",
            message=f"the file has {source.lines} lines, over the limit of "
            f"{self._max_lines}: split it into several batches",
        )

    def _publish(self, batch: Batch) -> None:
        try:
            for queue, job_ids in self.batches.queued_by_queue(batch.id):
                self._publisher.publish_bulk(job_ids, queue=queue)
                self._events.lines_queued(queue)
        except BrokerUnavailable as exc:
            # The jobs are safe in Postgres: maintenance publishes those not yet taken.
            log.warning("batch %s is stored but not all published: %s", batch.id, exc.message)

    def _after_stop(self, batch_id: str, running: list[str]) -> None:
        _stopped(
            batch_id, running, publisher=self._publisher, events=self._events, output=self._output
        )


class BatchLifecycle:
    """What happens to batches with nobody asking: they are finalized once every line has
    ended, and expire at the end of their window."""

    def __init__(
        self,
        *,
        batches: BatchStore,
        publisher: BatchPublisher,
        events: BatchEvents,
        output: BatchOutput,
    ) -> None:
        self._batches = batches
        self._publisher = publisher
        self._events = events
        self._output = output

    def finalize(self, batch_id: str) -> Batch | None:
        """If every line has ended: record the output and error files and end the batch,
        then measure the files."""
        batch = self._output.finalize(batch_id)
        if batch is not None:
            self._output.measure(batch)
        return batch

    def finalize_finished(self) -> None:
        """Finalize every batch whose last line has ended but which nobody finalized (its
        finalize task was lost)."""
        for batch_id in self._batches.finished():
            self.finalize(batch_id)

    def expire_due(self) -> list[str]:
        """Expire batches past their completion window; return their ids."""
        expired = []
        for batch_id in self._batches.expired():
            _, running = self._batches.stop(
                batch_id,
                code="batch_expired",
                message="the batch expired before this line ran",
            )
            _stopped(
                batch_id,
                running,
                publisher=self._publisher,
                events=self._events,
                output=self._output,
            )
            expired.append(batch_id)
        return expired


def _stopped(
    batch_id: str,
    running: list[str],
    *,
    publisher: BatchPublisher,
    events: BatchEvents,
    output: BatchOutput,
) -> None:
    """After a batch was stopped: abort its running lines, and have it finalized."""
    events.cancelled(running)
    try:
        publisher.publish_finalize(batch_id)
    except BrokerUnavailable:
        output.finalize(batch_id)  # here and now, rather than at maintenance's next sweep
