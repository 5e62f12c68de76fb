"""`/v1/webhook-endpoints` (secrets, rotation, re-enabling) and `/v1/webhook-deliveries`
(every attempt, and replay)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from api.deps import PrincipalDep, WebhookOpsDep
from api.errors import error_responses
from api.webhook_schemas import (
    DeliveryList,
    DeliveryPublic,
    EndpointCreate,
    EndpointList,
    EndpointPublic,
)
from inferq.domain.webhooks import DeliveryState

router = APIRouter(tags=["webhooks"], responses=error_responses(401, 429, 503))


@router.post("/v1/webhook-endpoints", response_model=EndpointPublic, responses=error_responses(422))
def create_endpoint(
    body: EndpointCreate, webhooks: WebhookOpsDep, principal: PrincipalDep
) -> EndpointPublic:
    """Register a receiver ahead of use and get its secret (submitting a job or batch with
    a new `webhook_url` registers it too). Registering a known URL returns it as it is,
    with its `format` changed if one is given."""
    endpoint = webhooks.register(tenant=principal.tenant, url=body.url, format_=body.format)
    return EndpointPublic.from_endpoint(endpoint)


@router.get("/v1/webhook-endpoints", response_model=EndpointList)
def list_endpoints(webhooks: WebhookOpsDep, principal: PrincipalDep) -> EndpointList:
    """This tenant's receivers, with their secrets."""
    return EndpointList.of(webhooks.endpoints(scope=principal.scope))


@router.post(
    "/v1/webhook-endpoints/{endpoint_id}/rotate-secret",
    response_model=EndpointPublic,
    responses=error_responses(404),
)
def rotate_secret(
    endpoint_id: str, webhooks: WebhookOpsDep, principal: PrincipalDep
) -> EndpointPublic:
    """A new secret. Until `previous_secret_expires_at`, webhooks carry signatures by both,
    so receivers can switch over without missing one."""
    endpoint = webhooks.rotate(endpoint_id, scope=principal.scope)
    return EndpointPublic.from_endpoint(endpoint)


@router.post(
    "/v1/webhook-endpoints/{endpoint_id}/enable",
    response_model=EndpointList,
    responses=error_responses(404),
)
def enable_endpoint(
    endpoint_id: str, webhooks: WebhookOpsDep, principal: PrincipalDep
) -> EndpointList:
    """Enable a receiver that was disabled (it answered 410 Gone)."""
    return EndpointList.of(webhooks.enable(endpoint_id, scope=principal.scope))


@router.get("/v1/webhook-deliveries", response_model=DeliveryList)
def list_deliveries(
    webhooks: WebhookOpsDep,
    principal: PrincipalDep,
    job_id: Annotated[str | None, Query(description="Only deliveries of this job.")] = None,
    batch_id: Annotated[str | None, Query(description="Only deliveries of this batch.")] = None,
    state: Annotated[
        DeliveryState | None, Query(description="Only deliveries in this state.")
    ] = None,
    after: Annotated[str | None, Query(description="Cursor: `last_id` of a page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Deliveries a page.")] = 20,
) -> DeliveryList:
    """Deliveries, newest first, each with every attempt (status code, latency, error)."""
    page = webhooks.page(
        scope=principal.scope,
        job_id=job_id,
        batch_id=batch_id,
        state=state,
        after=after,
        limit=limit,
    )
    return DeliveryList.of(page)


@router.get(
    "/v1/webhook-deliveries/{delivery_id}",
    response_model=DeliveryPublic,
    responses=error_responses(404),
)
def get_delivery(
    delivery_id: str, webhooks: WebhookOpsDep, principal: PrincipalDep
) -> DeliveryPublic:
    return DeliveryPublic.from_delivery(webhooks.get(delivery_id, scope=principal.scope))


@router.post(
    "/v1/webhook-deliveries/{delivery_id}/replay",
    response_model=DeliveryPublic,
    status_code=202,
    responses=error_responses(404, 409),
)
def replay_delivery(
    delivery_id: str, webhooks: WebhookOpsDep, principal: PrincipalDep
) -> DeliveryPublic:
    """Send a delivery again now, with the same `webhook-id` (receivers de-duplicate by it)."""
    delivery = webhooks.replay(delivery_id, scope=principal.scope)
    return DeliveryPublic.from_delivery(delivery)
