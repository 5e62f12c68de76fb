"""`/v1/jobs`: submit, read (with long-poll), list and cancel single jobs."""

from __future__ import annotations

import dataclasses
import functools
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from api.deps import JobOpsDep, OnlineDep, PrincipalDep, Reads
from api.errors import error_responses
from api.idempotency import IdempotencyKey
from api.schemas import JobCreate, JobList
from api.streams import event_stream, job_deltas
from api.submission import succeeded
from api.waiter import JobWaiter
from inferq.domain.jobs import Job, JobSpec, JobStatus
from inferq.store.idempotency import IdempotentRequest
from inferq.store.job_rows import new_job_id
from inferq.wire.model_catalog import CatalogModel
from inferq.wire.public import JobPublic

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 429, 503))

Wait = Annotated[
    float,
    Query(
        ge=0,
        description="Seconds to wait for the job to end before answering; at most the "
        "server's `max_wait_s` (120 by default), longer waits are cut to it.",
    ),
]


@router.post(
    "",
    status_code=202,
    response_model=JobPublic,
    responses={
        200: {"model": JobPublic, "description": "The job ended within `wait`: its result."},
        **error_responses(404, 409, 413, 422),
    },
)
async def create_job(
    body: JobCreate,
    online: OnlineDep,
    principal: PrincipalDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
    wait: Wait = 0,
) -> JobPublic | JSONResponse:
    """Submit a generation job; poll its `url` for the result, or ask to `wait` for it
    here (200 with the result if it ends in time, else 202). A client that hangs up
    while waiting leaves the job to run."""
    submission, waiter = online.submission, online.waiter
    build = functools.partial(_spec, body)
    spec = await submission.checked(body.model, _prompt_chars(body), build)
    webhook = await submission.checked_webhook(body.webhook_url, body.webhook_events)

    # Waited on, it is watched before it is written (its id chosen here), so it is not
    # read before the wait.
    job_id = new_job_id() if wait > 0 else None
    submitted: list[Job] = []

    async def create(request: IdempotentRequest | None) -> JobPublic:
        job = await submission.submit(
            principal, spec, webhook=webhook, idempotency=request, job_id=job_id
        )
        submitted.append(job)
        response.headers["Location"] = f"/v1/jobs/{job.id}"
        return JobPublic.from_job(job)

    async def created() -> JobPublic | JSONResponse:
        return await online.idempotency.run(
            idempotency_key, body=body, principal=principal, run=create
        )

    if job_id is None:
        return await created()
    async with waiter.watch(job_id) as woken:
        answer = await created()
        if not submitted:  # a replay answers as it first did
            return answer

        async def reread(_: str) -> Job:
            return await online.read((job_id, principal.scope))

        wait_s = min(wait, online.max_wait_s)
        ended = functools.partial(succeeded, submitted[0])
        job = await waiter.wait(woken, submitted[0], reread, timeout_s=wait_s, ended=ended)
    if job.status.is_terminal:
        response.status_code = 200
    return JobPublic.from_job(job)


async def _waited(
    job_id: str, scope: str | None, *, reads: Reads, waiter: JobWaiter, wait_s: float
) -> Job:
    """The job once it has ended, or as it is after `wait_s`."""

    async def reread(_: str) -> Job:
        return await reads((job_id, scope))

    return await waiter.until_ended(job_id, reread, timeout_s=wait_s)


def _spec(body: JobCreate, model: CatalogModel) -> JobSpec:
    spec = model.validator.spec(
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


@router.get("/{job_id}", response_model=JobPublic, responses=error_responses(404, 422))
async def get_job(
    job_id: str, online: OnlineDep, principal: PrincipalDep, wait: Wait = 0
) -> JobPublic:
    """A job's state and, once it has ended, its result or error."""
    if wait <= 0:
        return JobPublic.from_job(await online.read((job_id, principal.scope)))
    job = await _waited(
        job_id,
        principal.scope,
        reads=online.read,
        waiter=online.waiter,
        wait_s=min(wait, online.max_wait_s),
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
async def stream_job(job_id: str, online: OnlineDep, principal: PrincipalDep) -> Response:
    """Follow a job live (SSE): its output so far, each new piece as it is generated
    (`job.delta` events), then the job as stored, then `[DONE]`."""
    job = await online.read((job_id, principal.scope))

    async def read(job_id: str) -> Job:
        return await online.read((job_id, principal.scope))

    followed = online.follower.follow(job, read=read)
    return event_stream(job_deltas(followed, job=job))


@router.get("", response_model=JobList, responses=error_responses(422))
async def list_jobs(
    jobs: JobOpsDep,
    principal: PrincipalDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    batch_id: Annotated[str | None, Query(description="Only the lines of this batch.")] = None,
    after: Annotated[str | None, Query(description="The `last_id` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100, description="Jobs a page.")] = 20,
) -> JobList:
    """Jobs, newest first, a page at a time."""
    page = await run_in_threadpool(
        functools.partial(
            jobs.list,
            scope=principal.scope,
            status=status,
            batch_id=batch_id,
            after=after,
            limit=limit,
        )
    )
    return JobList.of(page, JobPublic.from_job)


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=error_responses(404, 409))
async def cancel_job(job_id: str, jobs: JobOpsDep, principal: PrincipalDep) -> JobPublic:
    """Cancel a job that has not finished; a running one is aborted in the engine."""
    job = await run_in_threadpool(functools.partial(jobs.cancel, job_id, scope=principal.scope))
    return JobPublic.from_job(job)
