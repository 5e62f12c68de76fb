"""`/v1/webhook-endpoints` (secrets, rotation, re-enabling) and `/v1/webhook-deliveries`
(every attempt, and replay)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.deps import PrincipalDep, Services, ServicesDep
from api.errors import error_responses
from inferq.db.support import utcnow
from inferq.exceptions import BrokerUnavailable, InvalidRequest
from inferq.webhooks import (
    Attempt,
    Delivery,
    DeliveryState,
    WebhookEndpoint,
    WebhookRequest,
    check_webhook_url,
    parse_networks,
)

router = APIRouter(tags=["webhooks"], responses=error_responses(401, 429, 503))


def webhook_request(
    services: Services, url: str | None, events: Sequence[str] | None
) -> WebhookRequest | None:
    """The webhook a job or batch asked for, its URL checked (SSRF), or None."""
    if url is None:
        if events is not None:
            raise InvalidRequest("webhook_events needs a webhook_url", param="webhook_events")
        return None
    allowed = parse_networks(services.settings.webhook_allowed_networks)
    check_webhook_url(url, allowed=allowed)
    return WebhookRequest(url=url, events=None if events is None else list(events))


class EndpointCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(max_length=2048, description="The receiver (public http(s) only).")


class EndpointPublic(BaseModel):
    """A receiver URL of this tenant and the secret its webhooks are signed with."""

    id: str
    object: str = "webhook_endpoint"
    url: str
    secret: str = Field(description="Verify signatures with it (Standard Webhooks, whsec_...).")
    previous_secret_expires_at: datetime | None = Field(
        description="After a rotation, until when the old secret also signs."
    )
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
            previous_secret_expires_at=overlap if overlap and overlap > utcnow() else None,
            enabled=endpoint.disabled_at is None,
            disabled_reason=endpoint.disabled_reason,
            created_at=endpoint.created_at,
        )


class EndpointList(BaseModel):
    object: str = "list"
    data: list[EndpointPublic]


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


@router.post("/v1/webhook-endpoints", response_model=EndpointPublic, responses=error_responses(422))
def create_endpoint(
    body: EndpointCreate, services: ServicesDep, principal: PrincipalDep
) -> EndpointPublic:
    """Register a receiver ahead of use and get its secret (submitting a job or batch with
    a new `webhook_url` registers it too). Registering a known URL returns it as it is."""
    webhook_request(services, body.url, None)
    endpoint = services.webhooks.register(tenant=principal.tenant, url=body.url)
    return EndpointPublic.from_endpoint(endpoint)


@router.get("/v1/webhook-endpoints", response_model=EndpointList)
def list_endpoints(services: ServicesDep, principal: PrincipalDep) -> EndpointList:
    """This tenant's receivers, with their secrets."""
    endpoints = services.webhooks.endpoints(scope=principal.scope)
    return EndpointList(data=[EndpointPublic.from_endpoint(e) for e in endpoints])


@router.post(
    "/v1/webhook-endpoints/{endpoint_id}/rotate-secret",
    response_model=EndpointPublic,
    responses=error_responses(404),
)
def rotate_secret(
    endpoint_id: str, services: ServicesDep, principal: PrincipalDep
) -> EndpointPublic:
    """A new secret. Until `previous_secret_expires_at`, webhooks carry signatures by both,
    so receivers can switch over without missing one."""
    endpoint = services.webhooks.rotate(
        endpoint_id,
        scope=principal.scope,
        overlap_s=services.settings.webhook_secret_overlap_s,
    )
    return EndpointPublic.from_endpoint(endpoint)


@router.post(
    "/v1/webhook-endpoints/{endpoint_id}/enable",
    response_model=EndpointList,
    responses=error_responses(404),
)
def enable_endpoint(
    endpoint_id: str, services: ServicesDep, principal: PrincipalDep
) -> EndpointList:
    """Enable a receiver that was disabled (it answered 410 Gone)."""
    services.webhooks.set_enabled(endpoint_id, scope=principal.scope, reason=None)
    endpoints = services.webhooks.endpoints(scope=principal.scope)
    return EndpointList(data=[EndpointPublic.from_endpoint(e) for e in endpoints])


@router.get("/v1/webhook-deliveries", response_model=DeliveryList)
def list_deliveries(
    services: ServicesDep,
    principal: PrincipalDep,
    job_id: str | None = None,
    batch_id: str | None = None,
    state: DeliveryState | None = None,
    after: Annotated[str | None, Query(description="Cursor: `last_id` of a page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> DeliveryList:
    """Deliveries, newest first, each with every attempt (status code, latency, error)."""
    deliveries, has_more = services.webhooks.page(
        scope=principal.scope,
        job_id=job_id,
        batch_id=batch_id,
        state=state,
        after=after,
        limit=limit,
    )
    return DeliveryList(
        data=[DeliveryPublic.from_delivery(d) for d in deliveries],
        has_more=has_more,
        last_id=deliveries[-1].id if deliveries else None,
    )


@router.get(
    "/v1/webhook-deliveries/{delivery_id}",
    response_model=DeliveryPublic,
    responses=error_responses(404),
)
def get_delivery(
    delivery_id: str, services: ServicesDep, principal: PrincipalDep
) -> DeliveryPublic:
    return DeliveryPublic.from_delivery(services.webhooks.get(delivery_id, scope=principal.scope))


@router.post(
    "/v1/webhook-deliveries/{delivery_id}/replay",
    response_model=DeliveryPublic,
    status_code=202,
    responses=error_responses(404, 409),
)
def replay_delivery(
    delivery_id: str, services: ServicesDep, principal: PrincipalDep
) -> DeliveryPublic:
    """Send a delivery again now, with the same `webhook-id` (receivers de-duplicate by it)."""
    delivery = services.webhooks.replay(delivery_id, scope=principal.scope)
    with contextlib.suppress(BrokerUnavailable):  # maintenance finds it due anyway
        services.publisher.publish_webhooks()
    return DeliveryPublic.from_delivery(delivery)
