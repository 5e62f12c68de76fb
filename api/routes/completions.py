"""OpenAI's online endpoints, `/v1/chat/completions` and `/v1/completions`, over the queue.

Each request is a single job (in Postgres, listed in /v1/jobs, counted by rate limits,
run ahead of batch lines) answered when it ends, or with `stream: true` as Server-Sent
Events while it runs. A client that hangs up before the answer cancels its job.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from api.deps import Online, OnlineDep, PrincipalDep
from api.errors import ended_error, error_responses
from api.streams import event_stream, holds_output, joined_chunks, openai_chunks
from inferq.constants import JOB_ID_HEADER
from inferq.domain.api_keys import Principal
from inferq.domain.jobs import Job, JobSpec, ServiceTier
from inferq.wire.model_catalog import CatalogModel
from inferq.wire.openai_bodies import ChatBody, CompletionBody, prepare_body, prepare_prompts
from inferq.wire.openai_format import completion_body, completion_id, usage

router = APIRouter(prefix="/v1", tags=["completions"], responses=error_responses(401, 429, 503))

_RESPONSES = {
    200: {
        "description": "The completion; with `stream: true`, Server-Sent Events of chunks.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **error_responses(404, 409, 413, 422),
}


@router.post("/chat/completions", response_model=None, responses=_RESPONSES)
async def chat_completions(
    body: ChatBody, online: OnlineDep, principal: PrincipalDep, request: Request
) -> Response:
    """A chat completion (OpenAI's shape), answered when it ends or streamed."""
    chars = sum(len(str(m.content)) for m in body.messages)
    return await _complete(
        body, chars, chat=True, online=online, principal=principal, request=request
    )


@router.post("/completions", response_model=None, responses=_RESPONSES)
async def completions(
    body: CompletionBody, online: OnlineDep, principal: PrincipalDep, request: Request
) -> Response:
    """A text completion (OpenAI's shape), answered when it ends or streamed; a list of
    prompts gets one choice per prompt (`n` each), indexed in order."""
    prompts = body.prompts()
    chars = sum(len(prompt) for prompt in prompts)
    if len(prompts) > 1:
        return await _complete_many(
            body, chars, online=online, principal=principal, request=request
        )
    return await _complete(
        body, chars, chat=False, online=online, principal=principal, request=request
    )


async def _complete(
    body: ChatBody | CompletionBody,
    prompt_chars: int,
    *,
    chat: bool,
    online: Online,
    principal: Principal,
    request: Request,
) -> Response:
    submission = online.submission
    spec = await submission.checked(body.model, prompt_chars, functools.partial(_spec, body))
    scope = principal.scope

    async def read(job_id: str) -> Job:
        return await online.read((job_id, scope))

    tier = ServiceTier.asked(body.service_tier)
    if not body.stream:
        job = await submission.run(principal, spec, read=read, request=request, announced=True)
        answer = _completion(job, chat=chat, tier=tier)
        return JSONResponse(answer, headers={JOB_ID_HEADER: job.id})
    job = await submission.submit(principal, spec)
    followed = online.follower.follow(job, read=read, held=holds_output(job, chat=chat))
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    chunks = openai_chunks(
        followed,
        job=job,
        chat=chat,
        model=job.model,
        include_usage=include_usage,
        service_tier=tier,
    )
    hangup = functools.partial(submission.cancel_abandoned, job.id, scope=scope)
    return event_stream(chunks, on_hangup=hangup, headers={JOB_ID_HEADER: job.id})


async def _complete_many(
    body: CompletionBody,
    prompt_chars: int,
    *,
    online: Online,
    principal: Principal,
    request: Request,
) -> Response:
    """A completion of several prompts: a job each, answered together once all have
    ended, or streamed one after another."""
    submission, reads = online.submission, online.read
    specs = await submission.checked(body.model, prompt_chars, functools.partial(_specs, body))
    scope = principal.scope
    n = body.n
    tier = ServiceTier.asked(body.service_tier)

    async def read(job_id: str) -> Job:
        return await reads((job_id, scope))

    if body.stream:
        return await _stream_many(body, specs, online, principal=principal, read=read)
    jobs = await online.submission.run_many(principal, specs, read=read, request=request)
    bodies = [_completion(job, chat=False, tier=tier) for job in jobs]
    merged = bodies[0]
    merged["choices"] = [
        {**choice, "index": i * n + choice["index"]}
        for i, each in enumerate(bodies)
        for choice in each["choices"]
    ]
    merged["usage"] = usage(
        sum(each["usage"]["prompt_tokens"] for each in bodies),
        sum(each["usage"]["completion_tokens"] for each in bodies),
    )
    return JSONResponse(merged, headers={JOB_ID_HEADER: ",".join(job.id for job in jobs)})


async def _stream_many(
    body: CompletionBody,
    specs: list[JobSpec],
    online: Online,
    *,
    principal: Principal,
    read: Callable[[str], Awaitable[Job]],
) -> Response:
    submission = online.submission
    jobs = [
        await submission.submit(principal, dataclasses.replace(spec, stream=True)) for spec in specs
    ]
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    tier = ServiceTier.asked(body.service_tier)
    streams = [
        openai_chunks(
            online.follower.follow(job, read=read),
            job=job,
            chat=False,
            model=job.model,
            include_usage=include_usage,
            service_tier=tier,
        )
        for job in jobs
    ]
    chunks = joined_chunks(streams, completion_id=completion_id(jobs[0].id, chat=False), n=body.n)

    async def hangup() -> None:
        for job in jobs:
            await submission.cancel_abandoned(job.id, scope=principal.scope)

    ids = ",".join(job.id for job in jobs)
    return event_stream(chunks, on_hangup=hangup, headers={JOB_ID_HEADER: ids})


def _specs(body: CompletionBody, model: CatalogModel) -> list[JobSpec]:
    validator = model.validator
    prepared = prepare_prompts(validator, body)
    priority = ServiceTier.asked(body.service_tier).priority
    return [
        dataclasses.replace(validator.finish(each, token_ids), priority=priority)
        for each, token_ids in zip(prepared, validator.encode(prepared), strict=True)
    ]


def _spec(body: ChatBody | CompletionBody, model: CatalogModel) -> JobSpec:
    validator = model.validator
    prepared = prepare_body(validator, body)
    [token_ids] = validator.encode([prepared])
    spec = validator.finish(prepared, token_ids)
    priority = ServiceTier.asked(body.service_tier).priority
    return dataclasses.replace(spec, stream=body.stream, priority=priority)


def _completion(job: Job, *, chat: bool, tier: ServiceTier) -> dict[str, Any]:
    """The completion an ended job answers with; a cancelled or failed one raises."""
    if error := ended_error(job.id, job.status, job.error):
        raise error
    assert job.result is not None, "a succeeded job has its result"
    return completion_body(
        job_id=job.id,
        chat=chat,
        created=int(job.created_at.timestamp()),
        model=job.model,
        choices=[c.to_dict() for c in job.result.choices],
        prompt_tokens=job.prompt_tokens,
        completion_tokens=job.result.completion_tokens,
        service_tier=tier,
    )
