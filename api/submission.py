"""What every route that submits work shares: the request checked (in a thread when its
prompt is long), its webhook URL checked, rate limits counted, a single job written with
others submitted at the same time (api/grouping.py), and a cancel for a client that went
away."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from api.grouping import Grouped
from api.ratelimit import RateLimiter
from api.token_follower import riding_out
from api.waiter import JobWaiter, ReadJob
from inferq.broker.events import EndAnnounced
from inferq.domain.api_keys import Principal
from inferq.domain.jobs import Job, JobResult, JobSpec, JobStatus
from inferq.domain.served_models import Runner
from inferq.domain.webhooks import WebhookRequest
from inferq.exceptions import InferqError
from inferq.operations.jobs import JobOperations
from inferq.operations.webhooks import WebhookOperations
from inferq.store.idempotency import IdempotentRequest
from inferq.store.job_rows import new_job_id
from inferq.store.jobs import NewJob
from inferq.wire.model_catalog import CatalogModel, ModelCatalog

log = logging.getLogger(__name__)

Built = TypeVar("Built")

# Prompts longer than this are tokenized in a worker thread, not on the event loop.
INLINE_PROMPT_CHARS = 8192


class Submission:
    """How the API's routes submit work and wait for it."""

    def __init__(
        self,
        *,
        catalog: ModelCatalog,
        webhooks: WebhookOperations,
        jobs: JobOperations,
        rate_limiter: RateLimiter,
        submit: Grouped[NewJob, Job],
        waiter: JobWaiter,
    ) -> None:
        self._catalog = catalog
        self._webhooks = webhooks
        self._jobs = jobs
        self._rate_limiter = rate_limiter
        self._submit = submit
        self._waiter = waiter

    async def checked(
        self,
        model: str | None,
        prompt_chars: int,
        build: Callable[[CatalogModel], Built],
        *,
        runner: Runner = "generate",
    ) -> Built:
        """`build(model)` for the served model a request named, in a worker thread if the
        prompt is long enough to hold the event loop or the model is not ready in memory
        (learning of it reads Postgres and loads its tokenizer)."""
        ready = self._catalog.cached(model, runner=runner)
        if ready is None or prompt_chars > INLINE_PROMPT_CHARS:
            return await run_in_threadpool(lambda: build(self._catalog.get(model, runner=runner)))
        return build(ready)

    async def checked_webhook(
        self, url: str | None, events: Sequence[str] | None
    ) -> WebhookRequest | None:
        """The webhook a job or batch asked for, its URL checked (SSRF), or None; in a
        worker thread when there is a URL: checking it may resolve the host name."""
        if url is None:
            return self._webhooks.request(url, events)
        return await run_in_threadpool(self._webhooks.request, url, events)

    async def submit(
        self,
        principal: Principal,
        spec: JobSpec,
        *,
        webhook: WebhookRequest | None = None,
        idempotency: IdempotentRequest | None = None,
        job_id: str | None = None,
    ) -> Job:
        """Count the job against the caller's token limit, then queue it (as `job_id`,
        if given: see `new_job_id`)."""
        await self._rate_limiter.tokens(
            principal, len(spec.prompt_token_ids) + spec.sampling.max_tokens * spec.sampling.n
        )
        return await self._submit(
            NewJob(
                spec=spec,
                tenant=principal.tenant,
                key_id=principal.key_id,
                quota=principal.quota.any,
                webhook=webhook,
                idempotency=idempotency,
                id=job_id,
            )
        )

    async def cancel_abandoned(self, job_id: str, *, scope: str | None) -> None:
        """Cancel a job whose client hung up, unless it has ended meanwhile."""
        try:
            await run_in_threadpool(functools.partial(self._jobs.cancel, job_id, scope=scope))
        except InferqError as exc:
            log.debug("job %s was not cancelled after its client left: %s", job_id, exc.message)
        else:
            log.info("cancelled job %s: its client hung up", job_id, extra={"job_id": job_id})

    async def run(
        self,
        principal: Principal,
        spec: JobSpec,
        *,
        read: ReadJob,
        request: Request,
        announced: bool = False,
    ) -> Job:
        """Queue the job and return it once it has ended (waiting out a Postgres restart);
        if the client hangs up first, it is cancelled.

        Its end is watched for before it is written, so it is not read before the wait.
        `announced`: a success announced is taken as it was announced, not read back."""
        return await self._run(
            principal, spec, read=read, gone=hung_up(request), announced=announced
        )

    async def run_many(
        self, principal: Principal, specs: Sequence[JobSpec], *, read: ReadJob, request: Request
    ) -> list[Job]:
        """`run` (announced) for the jobs of one request, side by side: a completion of
        several prompts. A client that hangs up cancels those not ended."""
        gone = asyncio.ensure_future(hung_up(request))
        try:
            runs = (
                self._run(principal, spec, read=read, gone=asyncio.shield(gone), announced=True)
                for spec in specs
            )
            return list(await asyncio.gather(*runs))
        finally:
            gone.cancel()

    async def _run(
        self,
        principal: Principal,
        spec: JobSpec,
        *,
        read: ReadJob,
        gone: Awaitable[None],
        announced: bool,
    ) -> Job:
        job_id = new_job_id()
        async with self._waiter.watch(job_id) as woken:
            job = await self.submit(principal, spec, job_id=job_id)
            ended = functools.partial(succeeded, job) if announced else None
            job = await self._waiter.wait(woken, job, riding_out(read), gone=gone, ended=ended)
        if not job.status.is_terminal:
            await self.cancel_abandoned(job.id, scope=principal.scope)
        return job


def succeeded(job: Job, announced: EndAnnounced) -> Job:
    """`job`, as submitted, once it has succeeded as `announced` (as a read would give
    it)."""
    return dataclasses.replace(
        job,
        status=JobStatus.SUCCEEDED,
        result=JobResult(choices=announced.choices, prompt_tokens=job.prompt_tokens),
        started_at=announced.started_at,
        finished_at=announced.finished_at,
        attempts=announced.attempts,
    )


async def hung_up(request: Request) -> None:
    """Returns when the client of `request`, whose body has been read, hangs up: the
    server's next message for it is the disconnect (no polling)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
