"""`/v1/batches`: OpenAI's Batch API over an uploaded file."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from api.batch_schemas import BatchCreate, BatchList, BatchPublic
from api.deps import PrincipalDep, ServicesDep
from api.errors import error_responses
from api.idempotency import IdempotencyKey, replay, request_hash
from api.routes.webhooks import webhook_request
from inferq.batches import Batch
from inferq.db.idempotency import IdempotentRequest, record_response

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=error_responses(401, 429, 503))


@router.post("", response_model=BatchPublic, responses=error_responses(409, 422))
def create_batch(
    body: BatchCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    idempotency_key: IdempotencyKey = None,
) -> BatchPublic | JSONResponse:
    """Create a batch: every line of the file is checked and queued, or the batch fails
    with the refused lines in `errors` and nothing queued."""
    webhook = webhook_request(services, body.webhook_url, body.webhook_events)
    request = None
    if idempotency_key is not None:
        request = IdempotentRequest(key_id=principal.key_id, key=idempotency_key)
        stored = services.idempotency.begin(
            request, request_hash=request_hash(body), ttl_s=services.settings.idempotency_ttl_s
        )
        if stored is not None:
            return replay(stored)

    def remember(session: Session, batch: Batch) -> None:
        if request is not None:
            body = BatchPublic.from_batch(batch).model_dump(mode="json")
            record_response(session, request, status_code=200, body=body)

    try:
        batch = services.batch_ops.create(
            tenant=principal.tenant,
            input_file_id=body.input_file_id,
            endpoint=body.endpoint,
            completion_window=body.completion_window,
            metadata=body.metadata or {},
            webhook=webhook,
            priority=body.priority,
            then=remember,
        )
    except BaseException:
        if request is not None:
            services.idempotency.abandon(request)
        raise
    return BatchPublic.from_batch(batch)


@router.get("/{batch_id}", response_model=BatchPublic, responses=error_responses(404))
def get_batch(batch_id: str, services: ServicesDep, principal: PrincipalDep) -> BatchPublic:
    """A batch: its status, request counts and files."""
    return BatchPublic.from_batch(services.batch_ops.batches.get(batch_id, scope=principal.scope))


@router.get("", response_model=BatchList, responses=error_responses(422))
def list_batches(
    services: ServicesDep,
    principal: PrincipalDep,
    after: Annotated[str | None, Query(description="The `last_id` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """Batches, newest first."""
    batches, has_more = services.batch_ops.batches.page(
        scope=principal.scope, after=after, limit=limit
    )
    data = [BatchPublic.from_batch(b) for b in batches]
    return BatchList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=has_more,
    )


@router.post("/{batch_id}/cancel", response_model=BatchPublic, responses=error_responses(404, 409))
def cancel_batch(batch_id: str, services: ServicesDep, principal: PrincipalDep) -> BatchPublic:
    """Cancel a batch: finished lines are kept, the others never run."""
    return BatchPublic.from_batch(services.batch_ops.cancel(batch_id, scope=principal.scope))
