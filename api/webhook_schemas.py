"""Bodies of the webhook routes: receivers (endpoints) and deliveries with every attempt."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from inferq.domain.webhooks import (
    Attempt,
    Delivery,
    DeliveryState,
    WebhookEndpoint,
    WebhookFormat,
)
from inferq.store.base import Page, utcnow


class EndpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, description="The receiver (public http(s) only).")
    format: WebhookFormat | SkipJsonSchema[None] = Field(
        None,
        description="The shape of its events: `inferq` (the job or batch in `data`) or "
        "`openai` (OpenAI's batch events, which `client.webhooks.unwrap` parses). A new "
        "receiver's is `inferq` unless given; a known one's changes only when given.",
    )


class EndpointPublic(BaseModel):
    """A receiver URL of this tenant and the secret its webhooks are signed with."""

    id: str
    object: str = "webhook_endpoint"
    url: str
    secret: str = Field(description="Verify signatures with it (Standard Webhooks, whsec_...).")
    previous_secret_expires_at: datetime | None = Field(
        description="After a rotation, until when the old secret also signs."
    )
    format: WebhookFormat = Field(description="The shape of its events.")
    enabled: bool
    disabled_reason: str | None
    created_at: datetime

    @classmethod
    def from_endpoint(cls, endpoint: WebhookEndpoint) -> EndpointPublic:
        overlap = endpoint.previous_expires_at
        return cls(
            id=endpoint.id,
            url=endpoint.url,
            secret=endpoint.secret,
            format=endpoint.format,
            previous_secret_expires_at=overlap if overlap and overlap > utcnow() else None,
            enabled=endpoint.disabled_at is None,
            disabled_reason=endpoint.disabled_reason,
            created_at=endpoint.created_at,
        )


class EndpointList(BaseModel):
    object: str = "list"
    data: list[EndpointPublic]

    @classmethod
    def of(cls, endpoints: Sequence[WebhookEndpoint]) -> EndpointList:
        return cls(data=[EndpointPublic.from_endpoint(e) for e in endpoints])


class AttemptPublic(BaseModel):
    number: int
    started_at: datetime
    status_code: int | None
    latency_ms: int | None
    error: str | None

    @classmethod
    def from_attempt(cls, attempt: Attempt) -> AttemptPublic:
        return cls(**attempt.__dict__)


class DeliveryPublic(BaseModel):
    """One event for one receiver: its `id` is the `webhook-id` header of every attempt."""

    id: str
    object: str = "webhook_delivery"
    event: str
    url: str
    endpoint_id: str
    job_id: str | None
    batch_id: str | None
    state: DeliveryState
    attempts: list[AttemptPublic]
    next_attempt_at: datetime | None
    created_at: datetime
    finished_at: datetime | None

    @classmethod
    def from_delivery(cls, delivery: Delivery) -> DeliveryPublic:
        return cls(
            id=delivery.id,
            event=delivery.event,
            url=delivery.url,
            endpoint_id=delivery.endpoint_id,
            job_id=delivery.job_id,
            batch_id=delivery.batch_id,
            state=delivery.state,
            attempts=[AttemptPublic.from_attempt(a) for a in delivery.history],
            next_attempt_at=delivery.next_attempt_at
            if delivery.state is DeliveryState.PENDING
            else None,
            created_at=delivery.created_at,
            finished_at=delivery.finished_at,
        )


class DeliveryList(BaseModel):
    object: str = "list"
    data: list[DeliveryPublic]
    has_more: bool
    last_id: str | None

    @classmethod
    def of(cls, page: Page[Delivery]) -> DeliveryList:
        deliveries = page.items
        return cls(
            data=[DeliveryPublic.from_delivery(d) for d in deliveries],
            has_more=page.has_more,
            last_id=deliveries[-1].id if deliveries else None,
        )
