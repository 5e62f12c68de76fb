"""Batch rows and the domain, both ways: what a new batch asks for and its row, the batch
read back from its row (if its tenant may still see it), and a line's result read back
from its job."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from inferq.domain.batches import (
    Batch,
    BatchStatus,
    BatchUsage,
    LineError,
    RequestCounts,
    ResultRow,
)
from inferq.domain.estimates import Estimate
from inferq.domain.jobs import JobStatus
from inferq.domain.webhooks import WebhookRequest
from inferq.exceptions import NotFound
from inferq.store.base import as_utc, scoped_row
from inferq.store.idempotency import IdempotentRequest
from inferq.store.models import BatchRow, JobRow


@dataclass(frozen=True, kw_only=True)
class NewBatch:
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    window: timedelta
    model: str | None
    metadata: dict[str, str] = field(default_factory=dict)
    webhook: WebhookRequest | None = None
    # Every line's priority (inferq.domain.jobs.MAX_PRIORITY).
    priority: int = 0
    # The idempotency key it was created under, whose response is remembered with it.
    idempotency: IdempotentRequest | None = None
    # How long its lines, results and files are kept once it ends (None: kept).
    output_expires_after_s: int | None = None
    # The API key that creates it (None: none, as in `inferq run`), and whether that key
    # has a quota to check the batch against (its whole file at once).
    key_id: str | None = None
    quota: bool = False


def new_batch_row(
    new: NewBatch, *, batch_id: str, now: datetime, webhook_endpoint_id: str | None
) -> dict[str, Any]:
    """The row of a batch whose lines are being checked (status validating)."""
    webhook = {}
    if webhook_endpoint_id is not None:
        assert new.webhook is not None
        webhook = {
            "webhook_endpoint_id": webhook_endpoint_id,
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
        "output_expires_after_s": new.output_expires_after_s,
        "key_id": new.key_id,
    }


def output_expiry(row: BatchRow, now: datetime) -> datetime | None:
    """When a batch that ends now has its lines, results and files deleted."""
    if row.output_expires_after_s is None:
        return None
    return now + timedelta(seconds=row.output_expires_after_s)


def scoped_batch(
    session: Session, batch_id: str, scope: str | None, now: datetime, *, for_update: bool = False
) -> BatchRow:
    """The batch's row, if it belongs to `scope` (a tenant; None sees every tenant) and its
    output has not expired (retention deletes it soon)."""
    row = scoped_row(session, BatchRow, batch_id, scope, noun="batch", for_update=for_update)
    if row.output_expires_at is not None and as_utc(row.output_expires_at) <= now:
        raise NotFound(f"no batch with id {batch_id!r}")
    return row


def batch_from_row(row: BatchRow) -> Batch:
    """The batch as its row says (its counters are kept up to date as lines end)."""
    return Batch(
        id=row.id,
        tenant=row.tenant,
        endpoint=row.endpoint,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=BatchStatus(row.status),
        created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at),
        metadata=row.metadata_,
        errors=tuple(LineError(**e) for e in row.errors or ()),
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        in_progress_at=as_utc(row.in_progress_at),
        finalizing_at=as_utc(row.finalizing_at),
        completed_at=as_utc(row.completed_at),
        failed_at=as_utc(row.failed_at),
        expired_at=as_utc(row.expired_at),
        cancelling_at=as_utc(row.cancelling_at),
        cancelled_at=as_utc(row.cancelled_at),
        model=row.model,
        priority=row.priority,
        counts=RequestCounts(
            total=row.request_total, completed=row.request_completed, failed=row.request_failed
        ),
        usage=BatchUsage(input_tokens=row.input_tokens, output_tokens=row.output_tokens),
        output_expires_after_s=row.output_expires_after_s,
        output_expires_at=as_utc(row.output_expires_at),
        estimate=None
        if row.estimate is None or BatchStatus(row.status).is_terminal
        else Estimate.from_dict(row.estimate),
    )


# The columns of a line's job that its result needs (`result_row`): these for every
# endpoint, and `RESULT_EXTRAS` for what embeddings and responses say besides.
RESULT_COLUMNS = (
    JobRow.id,
    JobRow.line,
    JobRow.custom_id,
    JobRow.model,
    JobRow.status,
    JobRow.choices,
    JobRow.prompt_tokens,
    JobRow.completion_tokens,
    JobRow.error,
    JobRow.finished_at,
)
RESULT_EXTRAS = (JobRow.embedding, JobRow.sampling, JobRow.response)


def result_row(row: Any, *, extras: bool = True) -> ResultRow:
    """A line's result from its job's `RESULT_COLUMNS`, and `RESULT_EXTRAS` if `extras`."""
    sampling = row.sampling if extras else None
    return ResultRow(
        job_id=row.id,
        line=row.line,
        custom_id=row.custom_id,
        model=row.model,
        status=JobStatus(row.status),
        choices=row.choices,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        error=row.error,
        finished_at=as_utc(row.finished_at),
        embedding=row.embedding if extras else None,
        pooling=sampling.get("pooling") if sampling else None,
        sampling=sampling,
        response=row.response if extras else None,
    )
