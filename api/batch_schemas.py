"""Bodies of the files and batches routes, in OpenAI's shapes (unix-second timestamps)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from api.schemas import BatchEvent, ListPage, not_null
from inferq.domain.batches import ENDPOINTS, FileEstimate, StoredFile
from inferq.wire.public import (
    BatchErrorPublic,
    BatchErrors,
    BatchEstimatePublic,
    BatchPublic,
    ExpiresAfter,
)
from inferq.wire.sampling_fields import Metadata, Priority


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
        """`file`, measured (FileOperations gives every file measured)."""
        assert file.bytes is not None, f"file {file.id} is not measured yet"
        return cls(
            id=file.id,
            bytes=file.bytes,
            created_at=int(file.created_at.timestamp()),
            filename=file.filename,
            purpose=file.purpose.value,
            expires_at=None if file.expires_at is None else int(file.expires_at.timestamp()),
        )


class FileList(ListPage[FilePublic]):
    pass


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class BatchCreate(BaseModel):
    """A batch over an uploaded file: one request per line."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: str = Field(description="An uploaded file with purpose 'batch'.")
    endpoint: Literal[
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"
    ] = Field(description=f"The URL every line must name: one of {', '.join(ENDPOINTS)}.")
    completion_window: str = Field(
        "24h",
        description="How long the batch may take: '24h', or hours, minutes or seconds "
        "('90m', '30s') up to 168h.",
    )
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | SkipJsonSchema[None] = Field(
        None,
        description="How long its lines, results and output files are kept once it ends; "
        "INFERQ_JOB_RETENTION_S by default.",
    )
    priority: Priority = 0
    webhook_url: str | SkipJsonSchema[None] = Field(
        None,
        max_length=2048,
        description="inferq's addition: where to POST a signed event when the batch ends.",
    )
    webhook_events: list[BatchEvent] | SkipJsonSchema[None] = Field(
        None, min_length=1, description="Which events to send; all four by default."
    )

    @field_validator("webhook_url", "webhook_events", "output_expires_after", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        return not_null(value)


class BatchList(ListPage[BatchPublic]):
    pass


class FileEstimatePublic(BaseModel):
    """What a batch of a file would hold and when it would end, were it created now (or,
    in `errors`, why it would fail)."""

    object: Literal["batch.estimate"] = "batch.estimate"
    model: str | None = Field(description="Its first line's model.")
    lines: int = Field(description="Its valid lines.")
    estimated_completion_at: int | None = Field(
        description="When it would end (unix seconds); null while its model's workers have "
        "measured nothing, or if it would fail."
    )
    estimate: BatchEstimatePublic | None
    errors: BatchErrors | None = Field(description="The lines a batch of it would refuse.")

    @classmethod
    def from_estimate(cls, made: FileEstimate) -> FileEstimatePublic:
        estimate = made.estimate
        errors = [BatchErrorPublic(**e.to_dict()) for e in made.errors]
        if made.refused > len(made.errors):
            errors.append(
                BatchErrorPublic(
                    code="too_many_errors",
                    line=None,
                    message=f"{made.refused - len(made.errors)} more lines would be refused",
                    param=None,
                )
            )
        return cls(
            model=made.model,
            lines=made.lines,
            estimated_completion_at=None
            if estimate is None
            else int(estimate.completion_at.timestamp()),
            estimate=None if estimate is None else BatchEstimatePublic.from_estimate(estimate),
            errors=BatchErrors(data=errors) if errors else None,
        )
