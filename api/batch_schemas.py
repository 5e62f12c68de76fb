"""Bodies of the files and batches routes, in OpenAI's shapes (unix-second timestamps)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from api.schemas import BatchEvent, not_null
from inferq.batches import ENDPOINTS, Batch, BatchStatus, StoredFile
from inferq.requests import Metadata, Priority


def _ts(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


class FilePublic(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str
    status: Literal["processed"] = "processed"
    status_details: str | None = None
    expires_at: int | None = None

    @classmethod
    def from_file(cls, file: StoredFile) -> FilePublic:
        return cls(
            id=file.id,
            bytes=file.bytes,
            created_at=int(file.created_at.timestamp()),
            filename=file.filename,
            purpose=file.purpose.value,
        )


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FilePublic]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchCreate(BaseModel):
    """A batch over an uploaded file: one request per line."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(description="An uploaded file with purpose 'batch'.")
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] = Field(
        description=f"The URL every line must name: one of {', '.join(ENDPOINTS)}."
    )
    completion_window: str = Field(
        "24h",
        description="How long the batch may take: '24h', or hours, minutes or seconds "
        "('90m', '30s') up to 168h.",
    )
    metadata: Metadata | None = None
    priority: Priority = 0
    webhook_url: str | SkipJsonSchema[None] = Field(
        None,
        max_length=2048,
        description="inferq's addition: where to POST a signed event when the batch ends.",
    )
    webhook_events: list[BatchEvent] | SkipJsonSchema[None] = Field(
        None, min_length=1, description="Which events to send; all four by default."
    )

    @field_validator("webhook_url", "webhook_events", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        return not_null(value)


class BatchErrorPublic(BaseModel):
    code: str
    line: int | None
    message: str
    param: str | None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchErrorPublic]


class RequestCountsPublic(BaseModel):
    total: int
    completed: int
    failed: int


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsagePublic(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)


class BatchPublic(BaseModel):
    """A batch, as OpenAI's Batch API returns it."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCountsPublic
    usage: BatchUsagePublic
    metadata: dict[str, str] | None
    priority: int = Field(0, description="inferq's addition: its lines' priority.")

    @classmethod
    def from_batch(cls, batch: Batch) -> BatchPublic:
        return cls(
            id=batch.id,
            endpoint=batch.endpoint,
            model=batch.model,
            priority=batch.priority,
            errors=BatchErrors(data=[BatchErrorPublic(**e.to_dict()) for e in batch.errors])
            if batch.errors
            else None,
            input_file_id=batch.input_file_id,
            completion_window=batch.completion_window,
            status=batch.status,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            created_at=int(batch.created_at.timestamp()),
            in_progress_at=_ts(batch.in_progress_at),
            expires_at=_ts(batch.expires_at),
            finalizing_at=_ts(batch.finalizing_at),
            completed_at=_ts(batch.completed_at),
            failed_at=_ts(batch.failed_at),
            expired_at=_ts(batch.expired_at),
            cancelling_at=_ts(batch.cancelling_at),
            cancelled_at=_ts(batch.cancelled_at),
            request_counts=RequestCountsPublic(
                total=batch.counts.total,
                completed=batch.counts.completed,
                failed=batch.counts.failed,
            ),
            usage=BatchUsagePublic(
                input_tokens=batch.usage.input_tokens,
                output_tokens=batch.usage.output_tokens,
                total_tokens=batch.usage.input_tokens + batch.usage.output_tokens,
            ),
            metadata=batch.metadata or None,
        )


class BatchList(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchPublic]
    first_id: str | None
    last_id: str | None
    has_more: bool
