"""`/v1/jobs`: submit, read (with long-poll), list and cancel single jobs."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Annotated

from fastapi import APIRouter, Query, Response
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api.deps import PrincipalDep, Services, ServicesDep
from api.errors import error_responses
from api.idempotency import IdempotencyKey, replay, request_hash
from api.routes.webhooks import webhook_request
from api.schemas import JobCreate, JobList, JobPublic
from inferq.constants import INTERACTIVE_QUEUE
from inferq.db.idempotency import IdempotentRequest, record_response
from inferq.exceptions import BrokerUnavailable, RetryLater
from inferq.jobs import Job, JobSpec, JobStatus
from inferq.keys import Principal
from inferq.webhooks import WebhookRequest

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 429, 503))

# How long a client refused for a full queue should wait before it tries again.
QUEUE_FULL_RETRY_S = 10

# A waiting request re-reads Postgres this often even without a pub/sub wake-up.
RECHECK_S = 1.0


@router.post(
    "", status_code=202, response_model=JobPublic, responses=error_responses(409, 413, 422)
)
def create_job(
    body: JobCreate,
    services: ServicesDep,
    principal: PrincipalDep,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> JobPublic | JSONResponse:
    """Submit a generation job; poll its `url` for the result."""
    spec = services.validator.spec(
        model=body.model,
        prompt=body.prompt,
        messages=body.messages,
        sampling=body,
        metadata=body.metadata,
    )
    webhook = webhook_request(services, body.webhook_url, body.webhook_events)
    request = None
    if idempotency_key is not None:
        request = IdempotentRequest(key_id=principal.key_id, key=idempotency_key)
        stored = services.idempotency.begin(
            request, request_hash=request_hash(body), ttl_s=services.settings.idempotency_ttl_s
        )
        if stored is not None:
            return replay(stored, location=stored.body.get("url"))
    try:
        job = _create(services, principal, spec, request, webhook)
    except BaseException:
        if request is not None:
            services.idempotency.abandon(request)
        raise
    try:
        services.publisher.publish_interactive([job.id])
    except BrokerUnavailable as exc:
        # The job is safe in Postgres; maintenance publishes it once Redis is back.
        log.warning("job %s is stored but not yet published: %s", job.id, exc.message)
        services.store.mark_unpublished([job.id])
    log.info(
        "accepted job %s",
        job.id,
        extra={"job_id": job.id, "tenant": principal.tenant},
    )
    response.headers["Location"] = f"/v1/jobs/{job.id}"
    return JobPublic.from_job(job)


def _create(
    services: Services,
    principal: Principal,
    spec: JobSpec,
    request: IdempotentRequest | None,
    webhook: WebhookRequest | None,
) -> Job:
    depth = services.queues.depth(INTERACTIVE_QUEUE)
    if depth >= services.settings.interactive_high_water:
        raise RetryLater(
            f"the interactive queue holds {depth} jobs, over its limit of "
            f"{services.settings.interactive_high_water}: retry later, or send bulk work as a "
            "batch file (/v1/batches), which is always accepted",
            retry_after_s=QUEUE_FULL_RETRY_S,
            code="queue_full",
        )
    services.rate_limiter.tokens(
        principal, len(spec.prompt_token_ids) + spec.sampling.max_tokens * spec.sampling.n
    )

    def remember(session: Session, jobs: list[Job]) -> None:
        if request is not None:
            body = JobPublic.from_job(jobs[0]).model_dump(mode="json")
            record_response(session, request, status_code=202, body=body)

    return services.store.create_jobs(
        [spec],
        tenant=principal.tenant,
        queue=INTERACTIVE_QUEUE,
        requeue_after_s=services.settings.requeue_after_s,
        webhook=webhook,
        then=remember,
    )[0]


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
    deadline = time.monotonic() + min(wait, services.settings.max_wait_s)
    read = functools.partial(services.store.get_job, job_id, scope=principal.scope)
    with services.waiter.watch(job_id) as finished:
        job = await run_in_threadpool(read)
        while not job.status.is_terminal and (left := deadline - time.monotonic()) > 0:
            finished.clear()
            try:
                await _wait_for(finished, min(left, RECHECK_S))
            finally:
                job = await run_in_threadpool(read)
    return JobPublic.from_job(job)


@router.get("", response_model=JobList, responses=error_responses(422))
def list_jobs(
    services: ServicesDep,
    principal: PrincipalDep,
    status: Annotated[JobStatus | None, Query(description="Only jobs in this state.")] = None,
    batch_id: Annotated[str | None, Query(description="Only the lines of this batch.")] = None,
    after: Annotated[str | None, Query(description="The `last_id` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JobList:
    """Jobs, newest first, a page at a time."""
    page = services.store.list_jobs(
        scope=principal.scope, status=status, batch_id=batch_id, after=after, limit=limit
    )
    data = [JobPublic.from_job(j) for j in page.items]
    return JobList(
        data=data,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
        has_more=page.has_more,
    )


@router.post("/{job_id}/cancel", response_model=JobPublic, responses=error_responses(404, 409))
def cancel_job(job_id: str, services: ServicesDep, principal: PrincipalDep) -> JobPublic:
    """Cancel a job that has not finished; a running one is aborted in the engine."""
    job = services.store.cancel_job(job_id, scope=principal.scope)
    services.events.cancelled([job.id])
    return JobPublic.from_job(job)


async def _wait_for(event: asyncio.Event, timeout_s: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout_s)
