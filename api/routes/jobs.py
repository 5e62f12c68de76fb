"""`/v1/jobs`: submit, read (with long-poll), list and cancel single jobs."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable
from typing import Annotated, ParamSpec, TypeVar

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from api.deps import PrincipalDep, Services, ServicesDep
from api.errors import error_responses
from api.idempotency import IdempotencyKey, replay, request_hash
from api.routes.webhooks import webhook_request
from api.schemas import JobCreate, JobList, JobPublic
from api.streams import event_stream, job_deltas
from api.submission import checked, submit
from inferq.db.idempotency import IdempotentRequest
from inferq.jobs import Job, JobSpec, JobStatus

P = ParamSpec("P")
T = TypeVar("T")
log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 429, 503))


@router.post(
    "", status_code=202, response_model=JobPublic, responses=error_responses(409, 413, 422)
)
async def create_job(
    body: JobCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic | JSONResponse:
    """Submit a generation job; poll its `url` for the result."""
    spec = await checked(_prompt_chars(body), functools.partial(_spec, services, body))
    # Checking a webhook URL may resolve its host name: not on the event loop.
    webhook = await _maybe_in_thread(
        body.webhook_url is not None,
        webhook_request,
        services,
        body.webhook_url,
        body.webhook_events,
    )
    request = None
    if idempotency_key is not None:
        request = IdempotentRequest(key_id=principal.key_id, key=idempotency_key)
        stored = await run_in_threadpool(
            functools.partial(
                services.idempotency.begin,
                request,
                request_hash=request_hash(body),
                ttl_s=services.settings.idempotency_ttl_s,
            )
        )
        if stored is not None:
            return replay(stored, location=stored.body.get("url"))
    try:
        job = await submit(services, principal, spec, webhook=webhook, idempotency=request)
    except BaseException:
        if request is not None:
            await run_in_threadpool(services.idempotency.abandon, request)
        raise
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return JobPublic.from_job(job)


def _spec(services: Services, body: JobCreate) -> JobSpec:
    spec = services.validator.spec(
        model=body.model,
        prompt=body.prompt,
        messages=body.messages,
        sampling=body,
        metadata=body.metadata,
    )
    return dataclasses.replace(spec, priority=body.priority, stream=body.stream)


def _prompt_chars(body: JobCreate) -> int:
    if body.prompt is not None:
        return len(body.prompt)
    return sum(len(str(m.content)) for m in body.messages or ())


async def _maybe_in_thread(
    in_thread: bool, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs
) -> T:
    if in_thread:
        return await run_in_threadpool(call, *args, **kwargs)
    return call(*args, **kwargs)


@router.get("/{job_id}", response_model=JobPublic, responses=error_responses(404, 422))
async def get_job(
    job_id: str,
    services: ServicesDep,
    principal: PrincipalDep,
    wait: Annotated[
        float,
        Query(
            ge=0,
            description="Seconds to wait for the job to end before answering; at most the "
            "server's `max_wait_s` (120 by default), longer waits are cut to it.",
        ),
    ] = 0,
) -> JobPublic:
    """A job's state and, once it has ended, its result or error."""
    read = (job_id, principal.scope)
    if wait <= 0:
        return JobPublic.from_job(await services.read(read))

    async def reread(_: str) -> Job:
        return await services.read(read)

    job = await services.waiter.until_ended(
        job_id, reread, timeout_s=min(wait, services.settings.max_wait_s)
    )
    return JobPublic.from_job(job)


@router.get(
    "/{job_id}/stream",
    response_class=EventSourceResponse,
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events."},
        **error_responses(404),
    },
)
async def stream_job(job_id: str, services: ServicesDep, principal: PrincipalDep) -> Response:
    """Follow a job live (SSE): its output so far, each new piece as it is generated
    (`job.delta` events), then the job as stored, then `[DONE]`."""
    job = await services.read((job_id, principal.scope))

    async def read(job_id: str) -> Job:
        return await services.read((job_id, principal.scope))

    followed = services.follower.follow(job, read=read, stored=True)
    return event_stream(job_deltas(followed, job=job))


@router.get("", response_model=JobList, responses=error_responses(422))
async def list_jobs(
    services: ServicesDep,
    principal: PrincipalDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    batch_id: Annotated[str | None, Query(description="Only the lines of this batch.")] = None,
    after: Annotated[str | None, Query(description="The `last_id` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JobList:
    """Jobs, newest first, a page at a time."""
    page = await run_in_threadpool(
        functools.partial(
            services.job_ops.list,
            scope=principal.scope,
            status=status,
            batch_id=batch_id,
            after=after,
            limit=limit,
        )
    )
    data = [JobPublic.from_job(j) for j in page.items]
    return JobList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=page.has_more,
    )


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=error_responses(404, 409))
async def cancel_job(job_id: str, services: ServicesDep, principal: PrincipalDep) -> JobPublic:
    """Cancel a job that has not finished; a running one is aborted in the engine."""
    job = await run_in_threadpool(
        functools.partial(services.job_ops.cancel, job_id, scope=principal.scope)
    )
    return JobPublic.from_job(job)
