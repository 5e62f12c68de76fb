"""`/v1/batches`: OpenAI's Batch API over an uploaded file."""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api.batch_schemas import BatchCreate, BatchList
from api.deps import PrincipalDep, ServicesDep
from api.errors import error_responses
from api.idempotency import IdempotencyKey, idempotent
from api.submission import checked_webhook
from inferq.db.idempotency import IdempotentRequest
from inferq.public import BatchPublic

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=error_responses(401, 429, 503))


@router.post("", response_model=BatchPublic, responses=error_responses(409, 422))
async def create_batch(
    body: BatchCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    idempotency_key: IdempotencyKey = None,
) -> BatchPublic | JSONResponse:
    """Create a batch: every line of the file is checked and queued, or the batch fails
    with the refused lines in `errors` and nothing queued."""
    webhook = await checked_webhook(services, body.webhook_url, body.webhook_events)

    async def create(request: IdempotentRequest | None) -> BatchPublic:
        batch = await run_in_threadpool(
            functools.partial(
                services.batch_ops.create,
                tenant=principal.tenant,
                input_file_id=body.input_file_id,
                endpoint=body.endpoint,
                completion_window=body.completion_window,
                metadata=body.metadata or {},
                webhook=webhook,
                priority=body.priority,
                idempotency=request,
            )
        )
        return BatchPublic.from_batch(batch)

    return await idempotent(
        idempotency_key, body=body, services=services, principal=principal, run=create
    )


@router.get("/{batch_id}", response_model=BatchPublic, responses=error_responses(404))
def get_batch(batch_id: str, services: ServicesDep, principal: PrincipalDep) -> BatchPublic:
    """A batch: its status, request counts and files."""
    return BatchPublic.from_batch(services.batch_ops.get(batch_id, scope=principal.scope))


@router.get("", response_model=BatchList, responses=error_responses(422))
def list_batches(
    services: ServicesDep,
    principal: PrincipalDep,
    after: Annotated[str | None, Query(description="The `last_id` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> BatchList:
    """Batches, newest first."""
    page = services.batch_ops.page(scope=principal.scope, after=after, limit=limit)
    return BatchList.of(page, BatchPublic.from_batch)


@router.post("/{batch_id}/cancel", response_model=BatchPublic, responses=error_responses(404, 409))
def cancel_batch(batch_id: str, services: ServicesDep, principal: PrincipalDep) -> BatchPublic:
    """Cancel a batch: finished lines are kept, the others never run."""
    return BatchPublic.from_batch(services.batch_ops.cancel(batch_id, scope=principal.scope))
