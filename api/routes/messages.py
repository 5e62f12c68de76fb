"""Anthropic's Messages API, `POST /v1/messages`, over the queue: a chat job as chat
completions make one (same queue, fair share, limits and usage), answered when it ends
in Anthropic's shape, or with `stream: true` as Anthropic's Server-Sent Events."""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import ServerSentEvent

from api.anthropic_schemas import TokenCount
from api.deps import (
    CatalogDep,
    FollowerDep,
    PrincipalDep,
    ReadDep,
    SubmissionDep,
    current_principal,
)
from api.errors import ended_error, error_json, error_responses
from api.streams import DONE, Followed, event_stream, holds_output
from api.token_follower import Ended, StreamBroken
from inferq.constants import JOB_ID_HEADER
from inferq.domain.jobs import Choice, Job, JobSpec
from inferq.wire import anthropic_format as anthropic
from inferq.wire.anthropic_bodies import CountTokensBody, MessagesBody, prepare_messages
from inferq.wire.model_catalog import CatalogModel

router = APIRouter(prefix="/v1", tags=["messages"], responses=error_responses(401, 429, 503))

_RESPONSES = {
    200: {
        "description": "The message; with `stream: true`, Anthropic's Server-Sent Events.",
        "content": {"application/json": {}, "text/event-stream": {}},
    },
    **error_responses(404, 409, 413, 422),
}


@router.post("/messages", response_model=None, responses=_RESPONSES)
async def create_message(
    body: MessagesBody,
    submission: SubmissionDep,
    read: ReadDep,
    follower: FollowerDep,
    principal: PrincipalDep,
    request: Request,
) -> Response:
    """A message (Anthropic's shape), answered when it ends or streamed."""
    chars = len(json.dumps(body.system or "")) + sum(len(str(m.content)) for m in body.messages)
    spec = await submission.checked(body.model, chars, functools.partial(_spec, body))
    scope = principal.scope

    async def read_job(job_id: str) -> Job:
        return await read((job_id, scope))

    if not body.stream:
        job = await submission.run(principal, spec, read=read_job, request=request, announced=True)
        return JSONResponse(_message(job), headers={JOB_ID_HEADER: job.id})
    job = await submission.submit(principal, spec)
    held = holds_output(job, chat=True)
    events = _events(follower.follow(job, read=read_job, held=held), job=job, held=held)
    hangup = functools.partial(submission.cancel_abandoned, job.id, scope=scope)
    return event_stream(events, on_hangup=hangup, headers={JOB_ID_HEADER: job.id}, send_done=False)


@router.post(
    "/messages/count_tokens",
    response_model=TokenCount,
    dependencies=[Depends(current_principal)],
    responses=error_responses(404, 413, 422),
)
def count_message_tokens(body: CountTokensBody, catalog: CatalogDep) -> TokenCount:
    """How many input tokens a message request's prompt is (nothing is queued)."""
    return _count(body, catalog.get(body.model))


def _count(body: CountTokensBody, model: CatalogModel) -> TokenCount:
    validator = model.validator
    [token_ids] = validator.encode([prepare_messages(validator, body)])
    return TokenCount(input_tokens=len(token_ids))


def _spec(body: MessagesBody, model: CatalogModel) -> JobSpec:
    validator = model.validator
    prepared = prepare_messages(validator, body)
    [token_ids] = validator.encode([prepared])
    return dataclasses.replace(validator.finish(prepared, token_ids), stream=body.stream)


def _message(job: Job) -> dict[str, Any]:
    """The message an ended job answers with; a cancelled or failed one raises."""
    if error := ended_error(job.id, job.status, job.error):
        raise error
    assert job.result is not None, "a succeeded job has its result"
    [choice] = job.result.choices
    return anthropic.message_body(
        job_id=job.id,
        model=job.model,
        blocks=anthropic.content(choice.text, _calls(choice)),
        finish_reason=choice.finish_reason,
        input_tokens=job.prompt_tokens,
        output_tokens=job.result.completion_tokens,
    )


def _event(data: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(
        data=json.dumps(data, ensure_ascii=False, separators=(",", ":")), event=data["type"]
    )


async def _events(
    followed: Followed, *, job: Job, held: bool
) -> AsyncIterator[ServerSentEvent | str]:
    """A job's output as Anthropic's stream: the message and its text block opened with
    the first output (or the end), a delta per piece of text, then the block and the
    message closed with the stop reason and usage; or an `error` event. Output that may
    hold tool calls (`held`) comes whole at the end, its calls as `tool_use` blocks. Then
    `DONE` (not sent)."""
    start = anthropic.message_start(job_id=job.id, model=job.model, input_tokens=job.prompt_tokens)
    opening = [start] if held else [start, anthropic.text_start()]
    try:
        async for item in followed:
            for data in opening:
                yield _event(data)
            opening = []
            if isinstance(item, Ended):
                for data in _ending(item, held=held):
                    yield _event(data)
                break
            for delta in [] if held else item:
                if delta.text:
                    yield _event(anthropic.text_delta(delta.text))
    except StreamBroken as exc:
        yield _event(anthropic.error_event(exc.message, type_="api_error"))
    yield DONE


def _ending(ended: Ended, *, held: bool) -> list[dict[str, Any]]:
    error = ended_error(ended.job.id, ended.status, ended.job.error)
    if error is not None:
        detail = error_json(error)["error"]
        return [anthropic.error_event(detail["message"], type_=detail["type"])]
    assert ended.job.result is not None, "a succeeded job has its result"
    [choice] = ended.job.result.choices
    blocks = (
        anthropic.whole_blocks(choice.text, _calls(choice)) if held else [anthropic.block_stop()]
    )
    end = anthropic.message_end(
        finish_reason=choice.finish_reason, output_tokens=ended.completion_tokens
    )
    return blocks + end


def _calls(choice: Choice) -> list[dict[str, Any]]:
    return [call.to_dict() for call in choice.tool_calls or ()]
