"""Request and response bodies of the jobs routes, and the page every listing returns;
the job as clients see it is `inferq.wire.public.JobPublic`, shared with webhook payloads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Literal, Protocol, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.json_schema import SkipJsonSchema

from inferq.store.base import Page
from inferq.wire.compat import Lenient
from inferq.wire.messages import ChatMessage
from inferq.wire.public import JobPublic
from inferq.wire.sampling_fields import Metadata, Priority, SamplingFields

JobEvent = Literal["job.succeeded", "job.failed", "job.cancelled"]
BatchEvent = Literal["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


class JobCreate(SamplingFields, Lenient):
    """A generation job: `prompt` for a raw completion, or `messages` for chat."""

    model_config = ConfigDict(
        extra="ignore",
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

    @model_validator(mode="after")
    def _streamable(self) -> Self:
        self.check_streamable(stream=self.stream)
        return self


def not_null(value: object) -> object:
    """Optional fields are left out, not sent as null (their constraints need a value)."""
    if value is None:
        raise ValueError("null is not accepted here: leave the field out instead")
    return value


class _Identified(Protocol):
    @property
    def id(self) -> str: ...


ItemT = TypeVar("ItemT")
IdentifiedT = TypeVar("IdentifiedT", bound=_Identified)


class ListPage(BaseModel, Generic[ItemT]):
    """The body of a listing (OpenAI's shape): one page, newest first."""

    object: Literal["list"] = "list"
    data: list[ItemT]
    first_id: str | None
    last_id: str | None
    has_more: bool

    @classmethod
    def of(cls, page: Page[IdentifiedT], public: Callable[[IdentifiedT], ItemT]) -> Self:
        """The body of a store's `page`, each item made public by `public`."""
        items = page.items
        return cls(
            data=[public(item) for item in items],
            first_id=items[0].id if items else None,
            last_id=items[-1].id if items else None,
            has_more=page.has_more,
        )


class JobList(ListPage[JobPublic]):
    """A page of jobs, newest first; pass `last_id` as `after` for the next page."""


class Health(BaseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)
