"""Anthropic's Message Batches over inferq's batches: the requests become the lines of an
input file (each a Messages request for `/v1/messages`), and the batch is made, run,
cancelled, expired and finalized as any other, with the same fair share, quotas, usage
and webhooks. Its results are read in Anthropic's shape."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from inferq.domain.batches import MESSAGES_ENDPOINT, Batch, LineError
from inferq.domain.webhooks import WebhookRequest
from inferq.exceptions import InvalidRequest, InvalidState, NotFound
from inferq.operations.batches import BatchOperations
from inferq.operations.files import FileOperations
from inferq.store.base import Page
from inferq.wire.anthropic_format import Outcomes, result_line

# Anthropic's window: a batch not done in a day expires.
COMPLETION_WINDOW = "24h"
REQUESTS_FILENAME = "message-batch-requests.jsonl"


@dataclass(frozen=True, kw_only=True)
class MessageRequest:
    """One request of a message batch: its id, and a Messages request body."""

    custom_id: str
    params: dict[str, Any]


class MessageBatches:
    def __init__(self, *, batches: BatchOperations, files: FileOperations) -> None:
        self._batches = batches
        self._files = files

    def create(
        self,
        *,
        tenant: str,
        key_id: str | None,
        quota: bool,
        requests: Sequence[MessageRequest],
        webhook: WebhookRequest | None = None,
    ) -> Batch:
        """Store the requests as the batch's input file and queue a job for each, or raise
        `InvalidRequest` naming the first refused request (the batch is then not listed)."""
        source = self._files.upload(
            tenant=tenant,
            filename=REQUESTS_FILENAME,
            chunks=_lines(requests),
            expires_after_s=None,
        )
        batch = self._batches.create(
            tenant=tenant,
            key_id=key_id,
            quota=quota,
            input_file_id=source.id,
            endpoint=MESSAGES_ENDPOINT,
            completion_window=COMPLETION_WINDOW,
            metadata={},
            webhook=webhook,
        )
        if batch.errors:
            raise _refused(batch.errors[0], requests)
        return batch

    def get(self, batch_id: str, *, scope: str | None) -> Batch:
        batch = self._batches.get(batch_id, scope=scope)
        if batch.endpoint != MESSAGES_ENDPOINT:
            raise NotFound(f"message batch {batch_id} not found")
        return batch

    def outcomes(self, batch: Batch) -> Outcomes | None:
        """How its requests ended, once it has ended (None before)."""
        return self._batches.batches.outcomes(batch.id) if batch.status.is_terminal else None

    def page(self, *, scope: str | None, after: str | None, limit: int) -> Page[Batch]:
        return self._batches.batches.page(
            scope=scope, after=after, limit=limit, endpoint=MESSAGES_ENDPOINT
        )

    def cancel(self, batch_id: str, *, scope: str | None) -> Batch:
        self.get(batch_id, scope=scope)
        return self._batches.cancel(batch_id, scope=scope)

    def results(self, batch_id: str, *, scope: str | None) -> Iterator[bytes]:
        """Its results as JSON lines, in request order; only once it has ended."""
        batch = self.get(batch_id, scope=scope)
        if not batch.status.is_terminal:
            raise InvalidState(
                f"message batch {batch_id} is still processing: its results come once it has ended"
            )
        rows = self._batches.batches.results(batch.id, errors=None, extras=False)
        return (json.dumps(result_line(row), ensure_ascii=False).encode() + b"\n" for row in rows)


def _lines(requests: Sequence[MessageRequest]) -> Iterator[bytes]:
    for request in requests:
        line = {
            "custom_id": request.custom_id,
            "method": "POST",
            "url": MESSAGES_ENDPOINT,
            "body": request.params,
        }
        yield json.dumps(line, ensure_ascii=False).encode() + b"\n"


def _refused(error: LineError, requests: Sequence[MessageRequest]) -> InvalidRequest:
    """A refused line, told as the request it came from (`requests.3.params.max_tokens`)."""
    if error.line is None:
        return InvalidRequest(error.message, param="requests", code=error.code)
    index = error.line - 1
    where = f"requests.{index} (custom_id {requests[index].custom_id!r})"
    message = error.message.split(": ", 1)[-1].replace("body.", "params.")
    param = (error.param or "").replace("body", "params", 1)
    return InvalidRequest(
        f"{where}: {message}",
        param=f"requests.{index}.{param}" if param else "requests",
        code=error.code,
    )
