"""Bodies of Anthropic's Message Batches routes, in Anthropic's shapes (RFC 3339 times)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from api.schemas import BatchEvent, not_null
from inferq.domain.batches import Batch
from inferq.wire import anthropic_format
from inferq.wire.anthropic_format import Outcomes

# Anthropic's limits on a batch: requests, and the form of a custom_id.
MAX_REQUESTS = 100_000
CUSTOM_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class TokenCount(BaseModel):
    """The input tokens a Messages request's prompt is."""

    input_tokens: int


class MessageBatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    custom_id: str = Field(pattern=CUSTOM_ID_PATTERN, description="Names the request's result.")
    params: dict[str, Any] = Field(
        description="A Messages request (as `POST /v1/messages` takes it), not streamed."
    )


class MessageBatchCreate(BaseModel):
    """A batch of Messages requests, given inline."""

    # Anthropic adds fields often; those not known here are ignored.
    model_config = ConfigDict(extra="allow")

    requests: list[MessageBatchRequest] = Field(min_length=1, max_length=MAX_REQUESTS)
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


class RequestCounts(BaseModel):
    """Every request is `processing` until the batch has ended."""

    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatchPublic(BaseModel):
    """A message batch (Anthropic's shape); `id` is the inferq batch's."""

    id: str
    type: Literal["message_batch"] = "message_batch"
    processing_status: Literal["in_progress", "canceling", "ended"]
    request_counts: RequestCounts
    created_at: datetime
    expires_at: datetime
    ended_at: datetime | None
    cancel_initiated_at: datetime | None
    archived_at: datetime | None
    results_url: str | None = Field(description="Where its results are, once it has ended.")

    @classmethod
    def of(
        cls, batch: Batch, *, outcomes: Outcomes | None, results_url: str | None
    ) -> MessageBatchPublic:
        return cls.model_validate(
            anthropic_format.message_batch(batch, outcomes=outcomes, results_url=results_url)
        )


class MessageBatchList(BaseModel):
    """A page of message batches, newest first; pass `last_id` as `after_id` for the next."""

    data: list[MessageBatchPublic]
    has_more: bool
    first_id: str | None
    last_id: str | None
