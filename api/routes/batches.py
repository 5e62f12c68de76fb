"""`/v1/batches`: OpenAI's Batch API over an uploaded file."""

from __future__ import annotations

import functools
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from api.batch_schemas import BatchCreate, BatchList, FileEstimatePublic
from api.deps import (
    BatchOpsDep,
    BatchOutputDep,
    FeedsDep,
    IdempotencyDep,
    PrincipalDep,
    SubmissionDep,
)
from api.errors import error_responses
from api.idempotency import IdempotencyKey
from api.streams import event_stream
from inferq.constants import BATCH_ENDED_HEADER, NEXT_CURSOR_HEADER
from inferq.store.idempotency import IdempotentRequest
from inferq.wire.public import BatchPublic

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=error_responses(401, 429, 503))
# Not under /v1/batches, where `estimate` would read as a batch id (GET /v1/batches/{id}).
estimates_router = APIRouter(
    prefix="/v1/batch-estimates", tags=["batches"], responses=error_responses(401, 429, 503)
)


@router.post("", response_model=BatchPublic, responses=error_responses(409, 422))
async def create_batch(
    body: BatchCreate,
    batches: BatchOpsDep,
    submission: SubmissionDep,
    idempotency: IdempotencyDep,
    principal: PrincipalDep,
    idempotency_key: IdempotencyKey = None,
) -> BatchPublic | JSONResponse:
    """Create a batch: every line of the file is checked and queued, or the batch fails
    with the refused lines in `errors` and nothing queued."""
    webhook = await submission.checked_webhook(body.webhook_url, body.webhook_events)
    expires = body.output_expires_after

    async def create(request: IdempotentRequest | None) -> BatchPublic:
        batch = await run_in_threadpool(
            functools.partial(
                batches.create,
                tenant=principal.tenant,
                key_id=principal.key_id,
                quota=principal.quota.any,
                input_file_id=body.input_file_id,
                endpoint=body.endpoint,
                completion_window=body.completion_window,
                metadata=body.metadata or {},
                webhook=webhook,
                priority=body.priority,
                idempotency=request,
                output_expires_after_s=expires.seconds if expires else None,
            )
        )
        return BatchPublic.from_batch(batch)

    return await idempotency.run(idempotency_key, body=body, principal=principal, run=create)


@estimates_router.post("", response_model=FileEstimatePublic, responses=error_responses(422))
def estimate_batch(
    body: BatchCreate, batches: BatchOpsDep, principal: PrincipalDep
) -> FileEstimatePublic:
    """When a batch of this file would end and what it would cost, were it created now:
    its lines are checked as a create checks them, and nothing is queued."""
    made = batches.estimate(
        tenant=principal.tenant, input_file_id=body.input_file_id, endpoint=body.endpoint
    )
    return FileEstimatePublic.from_estimate(made)


@router.get("/{batch_id}", response_model=BatchPublic, responses=error_responses(404))
def get_batch(batch_id: str, batches: BatchOpsDep, principal: PrincipalDep) -> BatchPublic:
    """A batch: its status, request counts and files."""
    return BatchPublic.from_batch(batches.get(batch_id, scope=principal.scope))


@router.get("", response_model=BatchList, responses=error_responses(422))
def list_batches(
    batches: BatchOpsDep,
    principal: PrincipalDep,
    after: Annotated[str | None, Query(description="The `last_id` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Batches a page.")] = 20,
) -> BatchList:
    """Batches, newest first."""
    page = batches.page(scope=principal.scope, after=after, limit=limit)
    return BatchList.of(page, BatchPublic.from_batch)


@router.post("/{batch_id}/cancel", response_model=BatchPublic, responses=error_responses(404, 409))
def cancel_batch(batch_id: str, batches: BatchOpsDep, principal: PrincipalDep) -> BatchPublic:
    """Cancel a batch: finished lines are kept, the others never run."""
    return BatchPublic.from_batch(batches.cancel(batch_id, scope=principal.scope))


@router.get(
    "/{batch_id}/output",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/octet-stream": {}, "text/event-stream": {}},
            "description": "JSON lines as in the batch's output file (and, with "
            "`include=errors`, its error file), in input order. With `follow=true`, "
            "Server-Sent Events: a `line` event per line (its `id` the line's number, its "
            "data the line), then an `end` event with the batch once it has ended.",
            "headers": {
                NEXT_CURSOR_HEADER: {
                    "description": "The `after` to ask with next: every line up to it has "
                    "ended and is in this response or an earlier one.",
                    "schema": {"type": "integer"},
                },
                BATCH_ENDED_HEADER: {
                    "description": "`true` once every line has ended: stop asking.",
                    "schema": {"type": "string", "enum": ["true", "false"]},
                },
            },
        },
        **error_responses(404, 422),
    },
)
async def batch_output(
    batch_id: str,
    batches: BatchOpsDep,
    output: BatchOutputDep,
    feeds: FeedsDep,
    principal: PrincipalDep,
    include: Annotated[
        Literal["errors"] | None,
        Query(description="`errors`: failed and cancelled lines too, in input order."),
    ] = None,
    after: Annotated[
        int,
        Query(
            ge=0,
            description="Only lines numbered after this (they count from 1): the "
            "`Inferq-Next-Cursor` of the previous response, or the `id` of the last event "
            "received when following.",
        ),
    ] = 0,
    follow: Annotated[
        bool,
        Query(description="Hold the connection and send each line as it ends (SSE)."),
    ] = False,
    last_event_id: Annotated[
        int | None,
        Header(
            ge=0,
            description="With `follow`: the `id` of the last event received (as EventSource "
            "sends it on reconnecting); it takes the place of `after`.",
        ),
    ] = None,
) -> Response:
    """The lines of a batch that have ended so far, streamed while it runs: those after
    `after`, up to the first line still queued or running; with `follow`, every line from
    there on as it ends, until the batch ends."""
    batch = await run_in_threadpool(batches.get, batch_id, scope=principal.scope)
    include_errors = include == "errors"
    if follow:
        events = feeds.follow(
            batch,
            after=after if last_event_id is None else last_event_id,
            include_errors=include_errors,
        )
        return event_stream(events)
    partial = await run_in_threadpool(
        output.partial_output, batch, after=after, include_errors=include_errors
    )
    return StreamingResponse(
        partial.lines,
        media_type="application/octet-stream",
        headers={
            NEXT_CURSOR_HEADER: str(partial.cursor),
            BATCH_ENDED_HEADER: "true" if partial.ended else "false",
        },
    )
