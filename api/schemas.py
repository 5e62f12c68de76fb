"""Request and response bodies. Conversions from the domain are explicit classmethods."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from inferq.jobs import Choice, Job, JobStatus
from inferq.requests import ChatMessage, Metadata, Priority, SamplingFields

JobEvent = Literal["job.succeeded", "job.failed", "job.cancelled"]
BatchEvent = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


class JobCreate(SamplingFields):
    """A generation job: `prompt` for a raw completion, or `messages` for chat."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["prompt"]}, {"required": ["messages"]}]},
    )

    model: str | None = Field(None, description="The served model; optional.")
    prompt: str | SkipJsonSchema[None] = Field(None, description="Raw text to complete.")
    messages: list[ChatMessage] | SkipJsonSchema[None] = Field(
        None, min_length=1, description="A chat, rendered with the model's chat template."
    )
    metadata: Metadata = Field(default_factory=dict)
    priority: Priority = 0
    stream: bool = Field(
        False,
        description="Send the tokens on as they are generated, to follow at "
        "/v1/jobs/{id}/stream; without it the output comes whole when the job ends.",
    )
    webhook_url: str | SkipJsonSchema[None] = Field(
        None,
        max_length=2048,
        description="Where to POST a signed event when the job ends (public http(s) only); "
        "its signing secret is at /v1/webhook-endpoints.",
    )
    webhook_events: list[JobEvent] | SkipJsonSchema[None] = Field(
        None, min_length=1, description="Which events to send; all three by default."
    )

    @field_validator("prompt", "messages", "webhook_url", "webhook_events", mode="before")
    @classmethod
    def _not_null(cls, value: object) -> object:
        return not_null(value)


def not_null(value: object) -> object:
    """Optional fields are left out, not sent as null (their constraints need a value)."""
    if value is None:
        raise ValueError("null is not accepted here: leave the field out instead")
    return value


class TopLogprob(BaseModel):
    token: str
    logprob: float


class TokenLogprobPublic(BaseModel):
    token: str
    logprob: float
    top_logprobs: list[TopLogprob]


class ToolCallPublic(BaseModel):
    id: str
    name: str
    arguments: str = Field(description="The call's arguments, as JSON text.")


class ChoicePublic(BaseModel):
    index: int
    text: str
    finish_reason: str | None = Field(description="`stop`, `length`, `tool_calls` or `abort`.")
    completion_tokens: int
    logprobs: list[TokenLogprobPublic] | None = None
    tool_calls: list[ToolCallPublic] | None = Field(
        None, description="The functions the model called (chats with `tools`)."
    )

    @classmethod
    def from_choice(cls, choice: Choice) -> ChoicePublic:
        return cls.model_validate(choice.to_dict())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class JobErrorPublic(BaseModel):
    code: str
    message: str


class JobPublic(BaseModel):
    """A job: its state, timestamps, and its result or error once it has ended."""

    id: str
    object: Literal["job"] = "job"
    url: str
    status: JobStatus
    model: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int = Field(description="Times a worker took the job (more than 1 after a crash).")
    params: dict[str, Any] = Field(description="The sampling parameters in effect.")
    metadata: dict[str, Any]
    priority: int = Field(description="Lower runs first; 0 is the default.")
    stream: bool = Field(description="Whether its tokens are sent on as they are generated.")
    choices: list[ChoicePublic] | None = Field(description="The output, once succeeded.")
    usage: Usage | None
    error: JobErrorPublic | None
    batch_id: str | None = Field(None, description="The batch this job is a line of.")
    custom_id: str | None = Field(None, description="That line's custom_id.")

    @classmethod
    def from_job(cls, job: Job) -> JobPublic:
        result = job.result
        usage = None
        if result is not None:
            usage = Usage(
                prompt_tokens=job.prompt_tokens,
                completion_tokens=result.completion_tokens,
                total_tokens=job.prompt_tokens + result.completion_tokens,
            )
        return cls(
            id=job.id,
            url=f"/v1/jobs/{job.id}",
            status=job.status,
            model=job.model,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            attempts=job.attempts,
            params=job.sampling.to_dict(),
            metadata=job.metadata,
            priority=job.priority,
            stream=job.stream,
            choices=None
            if result is None
            else [ChoicePublic.from_choice(c) for c in result.choices],
            usage=usage,
            error=None if job.error is None else JobErrorPublic(**job.error.to_dict()),
            batch_id=job.batch_id,
            custom_id=job.custom_id,
        )


class JobList(BaseModel):
    """A page of jobs, newest first; pass `last_id` as `after` for the next page."""

    object: Literal["list"] = "list"
    data: list[JobPublic]
    first_id: str | None
    last_id: str | None
    has_more: bool


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
