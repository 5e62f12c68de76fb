"""Server-Sent Events: a followed job rendered as OpenAI's stream chunks or as job deltas,
and the response that sends them, cancelling the job if the client hangs up first.

An error after the stream has started cannot change the status line any more: it is sent
as one event with OpenAI's error body (the `openai` client raises it), then `[DONE]`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent

from api.errors import ended_error, error_body, error_json
from api.token_follower import Ended, StreamBroken
from inferq.broker.token_stream import ChoiceDelta
from inferq.domain.jobs import Choice, Job
from inferq.wire.openai_format import chat_role_choice, chunk, chunk_choice, tool_call, usage
from inferq.wire.public import JobPublic

log = logging.getLogger(__name__)

DONE = "[DONE]"
# Keep-alive comments on a quiet stream (a long queue wait), for proxies that drop idle
# connections.
PING_S = 15

Followed = AsyncIterator[list[ChoiceDelta] | Ended]


def _json(data: Mapping[str, Any]) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


async def openai_chunks(
    followed: Followed,
    *,
    job: Job,
    chat: bool,
    model: str,
    include_usage: bool,
    service_tier: str | None = None,
) -> AsyncIterator[str]:
    """A job's output as `chat.completion.chunk`s (the role first, sent with the first
    output) or streamed `text_completion`s, one choice a chunk, the finish reason on each
    choice's last; the usage chunk if asked for; then `[DONE]`.

    A chat whose output may hold tool calls is sent once it has ended: the calls are read
    out of the whole output, and its raw text must not reach the client as content first."""
    created = int(job.created_at.timestamp())
    held = holds_output(job, chat=chat)

    def render(choices: list[dict[str, Any]], usage_: dict[str, int] | None = None) -> str:
        return _json(
            chunk(
                job_id=job.id,
                chat=chat,
                created=created,
                model=model,
                choices=choices,
                with_usage=include_usage,
                usage_=usage_,
                service_tier=service_tier,
            )
        )

    # The roles go with the first output (or the end), as vLLM sends them: a client that
    # stamps its time to first token at the first chunk then measures the first token, not
    # the queueing. SSE comments keep the connection alive meanwhile (`event_stream`).
    roles = [render([chat_role_choice(i)]) for i in range(job.sampling.n)] if chat else []
    offsets = [0] * job.sampling.n
    try:
        async for item in followed:
            for role in roles:
                yield role
            roles = []
            if isinstance(item, Ended):
                for event in _ending(
                    item, job_id=job.id, held=held, include_usage=include_usage, render=render
                ):
                    yield event
                break
            for delta in [] if held else item:
                choice = chunk_choice(
                    chat=chat,
                    index=delta.index,
                    text=delta.text,
                    logprobs=_logprobs(delta),
                    finish_reason=delta.finish_reason,
                    text_offset=offsets[delta.index],
                )
                offsets[delta.index] += len(delta.text)
                yield render([choice])
    except StreamBroken as exc:
        yield _json(error_body(exc.message, type_="server_error", code=exc.code))
    yield DONE


async def joined_chunks(
    streams: Sequence[AsyncIterator[str]], *, completion_id: str, n: int
) -> AsyncIterator[str]:
    """The `openai_chunks` of a completion's prompts (a job each) as one stream, as OpenAI
    sends several prompts: one id, prompt i's choice j at index i * n + j, one usage chunk
    (the sum) at the end if asked for, then `[DONE]`. Prompts are sent one after another;
    an error event ends the stream."""
    summed: dict[str, int] | None = None
    for i, events in enumerate(streams):
        async for event in events:
            if event == DONE:
                break
            data = json.loads(event)
            if "error" in data:
                yield event
                yield DONE
                return
            data["id"] = completion_id
            for choice in data["choices"]:
                choice["index"] += i * n
            if data.get("usage") is not None:
                tokens = data["usage"]
                summed = usage(
                    (summed or {}).get("prompt_tokens", 0) + tokens["prompt_tokens"],
                    (summed or {}).get("completion_tokens", 0) + tokens["completion_tokens"],
                )
                continue
            yield _json(data)
    if summed is not None:
        yield _json({**data, "choices": [], "usage": summed})
    yield DONE


async def job_deltas(followed: Followed, *, job: Job) -> AsyncIterator[str]:
    """A job's output as `job.delta` events, then the job as stored, then `[DONE]`."""
    try:
        async for item in followed:
            if isinstance(item, Ended):
                yield JobPublic.from_job(item.job).model_dump_json()
                break
            choices = [
                {
                    "index": d.index,
                    "text": d.text,
                    "logprobs": _logprobs(d),
                    "finish_reason": d.finish_reason,
                }
                for d in item
            ]
            yield _json({"object": "job.delta", "id": job.id, "choices": choices})
    except StreamBroken as exc:
        yield _json(error_body(exc.message, type_="server_error", code=exc.code))
    yield DONE


def _ending(
    ended: Ended,
    *,
    job_id: str,
    held: bool,
    include_usage: bool,
    render: Callable[[list[dict[str, Any]], dict[str, int] | None], str],
) -> list[str]:
    """The last events of a stream: an error, or the held output and the usage chunk."""
    error = ended_error(job_id, ended.status, ended.job.error)
    if error is not None:
        return [_json(error_json(error))]
    events: list[str] = []
    if held:
        assert ended.job.result is not None, "a succeeded job has its result"
        for whole in ended.job.result.choices:
            events.extend(render([c], None) for c in _whole_chat_choice(whole))
    if include_usage:
        events.append(render([], usage(ended.prompt_tokens, ended.completion_tokens)))
    return events


def holds_output(job: Job, *, chat: bool) -> bool:
    """Whether `openai_chunks` sends this job's output only once it has ended."""
    return chat and job.sampling.tool_choice is not None


def _whole_chat_choice(choice: Choice) -> list[dict[str, Any]]:
    """A finished chat choice as stream choices: its text, its tool calls, its end."""
    data = choice.to_dict()
    rendered = []
    if choice.text or not choice.tool_calls:
        rendered.append(
            chunk_choice(
                chat=True,
                index=choice.index,
                text=choice.text,
                logprobs=data["logprobs"],
                finish_reason=None,
                text_offset=0,
            )
        )
    if choice.tool_calls:
        calls = [tool_call(call, index=i) for i, call in enumerate(data["tool_calls"])]
        rendered.append(
            {
                "index": choice.index,
                "delta": {"tool_calls": calls},
                "logprobs": None,
                "finish_reason": None,
            }
        )
    rendered.append(
        {
            "index": choice.index,
            "delta": {},
            "logprobs": None,
            "finish_reason": choice.finish_reason,
        }
    )
    return rendered


def _logprobs(delta: ChoiceDelta) -> list[dict[str, Any]] | None:
    return None if delta.logprobs is None else [lp.to_dict() for lp in delta.logprobs]


# Hang-up handlers still running: held so that they are not collected half-way.
_cleanups: set[asyncio.Task[None]] = set()


def event_stream(
    events: AsyncIterator[str] | AsyncIterator[ServerSentEvent | str] | AsyncIterator[bytes],
    *,
    on_hangup: Callable[[], Coroutine[object, object, None]] | None = None,
    headers: Mapping[str, str] | None = None,
    send_done: bool = True,
) -> EventSourceResponse:
    """An SSE response of `events`; `on_hangup` runs if the client leaves before `[DONE]`
    (which `events` ends with, and which is sent unless `send_done` is false)."""
    completed = False

    async def body() -> AsyncIterator[ServerSentEvent | str | bytes]:
        nonlocal completed
        async for data in events:
            if data == DONE:
                completed = True
                if not send_done:
                    continue
            yield data

    async def closed(_message: object) -> None:
        if completed or on_hangup is None:
            return
        # In a task of its own: the response's tasks are being cancelled.
        task = asyncio.get_running_loop().create_task(on_hangup())
        _cleanups.add(task)
        task.add_done_callback(_cleanups.discard)

    return EventSourceResponse(
        body(),
        headers=dict(headers or {}),
        ping=PING_S,
        sep="\n",
        client_close_handler_callable=closed,
    )
