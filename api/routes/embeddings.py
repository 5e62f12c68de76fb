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

from api.deps import PrincipalDep, ReadDep, SubmissionDep
from api.errors import ended_error, error_responses
from inferq.constants import JOB_ID_HEADER
from inferq.domain.jobs import Job
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
    body: EmbeddingBody,
    submission: SubmissionDep,
    reads: ReadDep,
    principal: PrincipalDep,
    request: Request,
) -> JSONResponse:
    """Embeddings of texts or token ids (OpenAI's shape), answered when they are ready."""
    build = functools.partial(embedding_spec, body)
    spec = await submission.checked(body.model, body.size, build, runner="pooling")
    scope = principal.scope

    async def read(job_id: str) -> Job:
        return await reads((job_id, scope))

    job = await submission.run(principal, spec, read=read, request=request)
    return JSONResponse(_embeddings(job), headers={JOB_ID_HEADER: job.id})


def _embeddings(job: Job) -> dict[str, Any]:
    """The vectors an ended job answers with; a cancelled or failed one raises."""
    if error := ended_error(job.id, job.status, job.error):
        raise error
    result = job.result
    assert result is not None, "a succeeded job has its result"
    assert result.embedding is not None, "a pooling job's result is its embedding"
    return embedding_body(
        model=job.model,
        embedding=result.embedding,
        pooling=job.sampling.pooling or {},
        prompt_tokens=job.prompt_tokens,
    )
