"""`/v1/messages/batches`: Anthropic's Message Batches over inferq's batches."""

from __future__ import annotations

import functools
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.anthropic_schemas import MessageBatchCreate, MessageBatchList, MessageBatchPublic
from api.deps import MessageBatchesDep, PrincipalDep, SubmissionDep
from api.errors import error_responses
from inferq.domain.batches import Batch
from inferq.exceptions import InvalidRequest
from inferq.operations.message_batches import MessageBatches, MessageRequest

router = APIRouter(
    prefix="/v1/messages/batches", tags=["messages"], responses=error_responses(401, 429, 503)
)

_RESULTS_ROUTE = "message_batch_results"


@router.post("", response_model=MessageBatchPublic, responses=error_responses(422))
async def create_message_batch(
    body: MessageBatchCreate,
    batches: MessageBatchesDep,
    submission: SubmissionDep,
    principal: PrincipalDep,
    request: Request,
) -> MessageBatchPublic:
    """Create a message batch: every request is checked and queued, or none is and the
    first refused one is named."""
    webhook = await submission.checked_webhook(body.webhook_url, body.webhook_events)
    requests = [MessageRequest(custom_id=r.custom_id, params=r.params) for r in body.requests]
    batch = await run_in_threadpool(
        functools.partial(
            batches.create,
            tenant=principal.tenant,
            key_id=principal.key_id,
            quota=principal.quota.any,
            requests=requests,
            webhook=webhook,
        )
    )
    return _public(batch, batches, request)


@router.get("/{batch_id}", response_model=MessageBatchPublic, responses=error_responses(404))
def get_message_batch(
    batch_id: str, batches: MessageBatchesDep, principal: PrincipalDep, request: Request
) -> MessageBatchPublic:
    """A message batch: its processing status and request counts."""
    return _public(batches.get(batch_id, scope=principal.scope), batches, request)


@router.get("", response_model=MessageBatchList, responses=error_responses(422))
def list_message_batches(
    batches: MessageBatchesDep,
    principal: PrincipalDep,
    request: Request,
    after_id: Annotated[
        str | None, Query(description="The `last_id` of the previous page.")
    ] = None,
    before_id: Annotated[str | None, Query(description="Not supported: use `after_id`.")] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Batches a page.")] = 20,
) -> MessageBatchList:
    """Message batches, newest first."""
    if before_id is not None:
        raise InvalidRequest(
            "before_id is not supported: page from the newest with after_id", param="before_id"
        )
    page = batches.page(scope=principal.scope, after=after_id, limit=limit)
    items = page.items
    return MessageBatchList(
        data=[_public(batch, batches, request) for batch in items],
        has_more=page.has_more,
        first_id=items[0].id if items else None,
        last_id=items[-1].id if items else None,
    )


@router.post(
    "/{batch_id}/cancel", response_model=MessageBatchPublic, responses=error_responses(404, 409)
)
def cancel_message_batch(
    batch_id: str, batches: MessageBatchesDep, principal: PrincipalDep, request: Request
) -> MessageBatchPublic:
    """Cancel a message batch: ended requests keep their results, the others are canceled."""
    return _public(batches.cancel(batch_id, scope=principal.scope), batches, request)


@router.get(
    "/{batch_id}/results",
    name=_RESULTS_ROUTE,
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/x-jsonl": {}},
            "description": "A JSON line a request, in request order: its `custom_id` and "
            "its `result` (`succeeded` with the message, `errored`, `canceled` or `expired`).",
        },
        **error_responses(404, 409),
    },
)
def message_batch_results(
    batch_id: str, batches: MessageBatchesDep, principal: PrincipalDep
) -> StreamingResponse:
    """The results of a message batch that has ended."""
    lines = batches.results(batch_id, scope=principal.scope)
    return StreamingResponse(lines, media_type="application/x-jsonl")


def _public(batch: Batch, batches: MessageBatches, request: Request) -> MessageBatchPublic:
    outcomes = batches.outcomes(batch)
    url = None if outcomes is None else str(request.url_for(_RESULTS_ROUTE, batch_id=batch.id))
    return MessageBatchPublic.of(batch, outcomes=outcomes, results_url=url)
