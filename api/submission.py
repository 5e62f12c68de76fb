"""What every route that makes a single job shares: the request checked (in a thread when
its prompt is long), rate limits counted, the job written with others submitted at the
same time (api/grouping.py), and a cancel for a client that went away."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

from starlette.concurrency import run_in_threadpool

from api.deps import Services
from inferq.db.idempotency import IdempotentRequest
from inferq.db.jobs import NewJob
from inferq.exceptions import InferqError
from inferq.jobs import Job, JobSpec
from inferq.keys import Principal
from inferq.webhooks import WebhookRequest

log = logging.getLogger(__name__)

# Prompts longer than this are tokenized in a worker thread, not on the event loop.
INLINE_PROMPT_CHARS = 8192


async def checked(prompt_chars: int, build: Callable[[], JobSpec]) -> JobSpec:
    """`build()`, in a worker thread if the prompt is long enough to hold the event loop."""
    if prompt_chars > INLINE_PROMPT_CHARS:
        return await run_in_threadpool(build)
    return build()


async def submit(
    services: Services,
    principal: Principal,
    spec: JobSpec,
    *,
    webhook: WebhookRequest | None = None,
    idempotency: IdempotentRequest | None = None,
) -> Job:
    """Count the job against the caller's token limit, then queue it."""
    await services.rate_limiter.tokens(
        principal, len(spec.prompt_token_ids) + spec.sampling.max_tokens * spec.sampling.n
    )
    return await services.submit(
        NewJob(spec=spec, tenant=principal.tenant, webhook=webhook, idempotency=idempotency)
    )


async def cancel_abandoned(services: Services, job_id: str, *, scope: str | None) -> None:
    """Cancel a job whose client hung up, unless it has ended meanwhile."""
    try:
        await run_in_threadpool(functools.partial(services.job_ops.cancel, job_id, scope=scope))
    except InferqError as exc:
        log.debug("job %s was not cancelled after its client left: %s", job_id, exc.message)
    else:
        log.info("cancelled job %s: its client hung up", job_id, extra={"job_id": job_id})
