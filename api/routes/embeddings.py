"""OpenAI's `/v1/embeddings`, over the queue.

A request is one single job however many inputs it holds (in Postgres, listed in
/v1/jobs, counted by rate limits in prompt tokens, run ahead of batch lines), answered
when it ends. A client that hangs up before the answer cancels its job.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.deps import PrincipalDep, ServicesDep
from api.errors import error_responses
from api.submission import checked, submit, until_ended
from inferq.constants import JOB_ID_HEADER
from inferq.domain.jobs import Job, JobStatus
from inferq.exceptions import InvalidState, JobFailed
from inferq.wire.embeddings import EmbeddingBody, embedding_body, embedding_spec

router = APIRouter(prefix="/v1", tags=["embeddings"], responses=error_responses(401, 429, 503))

_RESPONSES = {
    200: {
        "description": "The vectors, one per input in input order (OpenAI's `list` of "
        "`embedding`s), as numbers or base64 as `encoding_format` asked.",
        "content": {"application/json": {}},
    },
    **error_responses(404, 409, 413, 422),
}


@router.post("/embeddings", response_model=None, responses=_RESPONSES)
async def embeddings(
    body: EmbeddingBody, services: ServicesDep, principal: PrincipalDep, request: Request
) -> JSONResponse:
    """Embeddings of texts or token ids (OpenAI's shape), answered when they are ready."""
    build = functools.partial(embedding_spec, body)
    spec = await checked(services, body.model, body.size, build, runner="pooling")
    job = await submit(services, principal, spec)
    scope = principal.scope

    async def read(job_id: str) -> Job:
        return await services.read((job_id, scope))

    job = await until_ended(job, read=read, services=services, request=request, scope=scope)
    return JSONResponse(_embeddings(job), headers={JOB_ID_HEADER: job.id})


def _embeddings(job: Job) -> dict[str, Any]:
    """The vectors an ended job answers with; a cancelled or failed one raises."""
    if job.status is JobStatus.CANCELLED:
        raise InvalidState(f"the request was cancelled (job {job.id})")
    result = job.result
    if job.status is JobStatus.FAILED or result is None or result.embedding is None:
        error = job.error
        raise JobFailed(
            error.message if error else f"job {job.id} failed",
            code=error.code if error else "failed",
        )
    return embedding_body(
        model=job.model,
        embedding=result.embedding,
        pooling=job.sampling.pooling or {},
        prompt_tokens=job.prompt_tokens,
    )
