"""A followed job as the Server-Sent Events of OpenAI's Responses API: `response.created`
at once; `response.in_progress`, the message item and its text deltas as the output is
generated; the items closed and `response.completed` (or `.incomplete`, `.failed`) once
it has ended. Every event carries its `sequence_number`; the stream sends no `[DONE]`.

A response whose output may hold function calls is sent once it has ended (as chat
completions are, `api.streams.holds_output`): its calls are read out of the whole output.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from sse_starlette import ServerSentEvent

from api.streams import DONE, Followed, holds_output
from api.token_follower import Ended, StreamBroken
from inferq.domain.jobs import Job, JobStatus
from inferq.wire.response_objects import (
    ResponseState,
    function_call_item,
    message_item,
    output_text,
    response_logprobs,
    response_object,
)

# The event that ends a stream, by the response's last status.
_LAST = {"completed": "response.completed", "incomplete": "response.incomplete"}


class _Events:
    """Numbers and renders the events of one stream."""

    def __init__(self) -> None:
        self._numbers = itertools.count()

    def __call__(self, type_: str, **fields: Any) -> ServerSentEvent:
        data = {"type": type_, "sequence_number": next(self._numbers), **fields}
        return ServerSentEvent(
            data=json.dumps(data, ensure_ascii=False, separators=(",", ":")), event=type_
        )


async def response_events(followed: Followed, *, job: Job) -> AsyncIterator[ServerSentEvent | str]:
    """The events of a streamed response, then `DONE` (which `event_stream` keeps to
    itself). The last events are the stored response."""
    event = _Events()
    opening = response_object(ResponseState.of_job(job))
    yield event("response.created", response=opening)
    held = holds_output(job, chat=True)
    message = _Message(job.id, event)
    started = False
    try:
        async for item in followed:
            if not started:
                yield event("response.in_progress", response={**opening, "status": "in_progress"})
                started = True
            if isinstance(item, Ended):
                for ending in _ending(item, message, event):
                    yield ending
                break
            for delta in [] if held else item:
                for sent in message.delta(delta.text, delta.logprobs):
                    yield sent
    except StreamBroken as exc:
        yield event("error", code=exc.code, message=exc.message, param=None)
    yield DONE


class _Message:
    """The assistant's message item while its text streams."""

    def __init__(self, job_id: str, event: _Events) -> None:
        self._job_id = job_id
        self._event = event
        self.opened = False
        self.item_id = message_item(job_id, None, None)["id"]

    def open(self) -> Iterator[ServerSentEvent]:
        if self.opened:
            return
        self.opened = True
        item = message_item(self._job_id, None, None, status="in_progress")
        yield self._event("response.output_item.added", output_index=0, item=item)
        yield self._event(
            "response.content_part.added",
            item_id=self.item_id,
            output_index=0,
            content_index=0,
            part=output_text("", None),
        )

    def delta(self, text: str, logprobs: Any) -> Iterator[ServerSentEvent]:
        if not text:
            return
        yield from self.open()
        entries = None if logprobs is None else [lp.to_dict() for lp in logprobs]
        yield self._event(
            "response.output_text.delta",
            item_id=self.item_id,
            output_index=0,
            content_index=0,
            delta=text,
            logprobs=response_logprobs(entries),
        )


def _ending(ended: Ended, message: _Message, event: _Events) -> Iterator[ServerSentEvent]:
    if ended.status is JobStatus.CANCELLED:
        yield event("error", code="cancelled", message="the response was cancelled", param=None)
        return
    final = response_object(ResponseState.of_job(ended.job))
    if ended.status is JobStatus.FAILED:
        yield event("response.failed", response=final)
        return
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            yield from _message_done(item, message, event)
        else:
            yield from _call_done(index, item, ended.job.id, event)
    yield event(_LAST[final["status"]], response=final)


def _message_done(
    item: Mapping[str, Any], message: _Message, event: _Events
) -> Iterator[ServerSentEvent]:
    """Close the message item; text that was held (or never streamed) is sent whole."""
    part = item["content"][0]
    if not message.opened:
        yield from message.open()
        if part["text"]:
            yield event(
                "response.output_text.delta",
                item_id=item["id"],
                output_index=0,
                content_index=0,
                delta=part["text"],
                logprobs=part["logprobs"],
            )
    where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    yield event("response.output_text.done", **where, text=part["text"], logprobs=part["logprobs"])
    yield event("response.content_part.done", **where, part=part)
    yield event("response.output_item.done", output_index=0, item=item)


def _call_done(
    index: int, item: Mapping[str, Any], job_id: str, event: _Events
) -> Iterator[ServerSentEvent]:
    """A function call, sent whole: added, its arguments, done."""
    call = {"id": item["call_id"], "name": item["name"], "arguments": item["arguments"]}
    call_index = int(item["id"].rsplit("_", 1)[1])
    started = function_call_item(job_id, call_index, call, arguments="")
    yield event("response.output_item.added", output_index=index, item=started)
    where = {"item_id": item["id"], "output_index": index}
    yield event("response.function_call_arguments.delta", **where, delta=item["arguments"])
    yield event(
        "response.function_call_arguments.done",
        **where,
        name=item["name"],
        arguments=item["arguments"],
    )
    yield event("response.output_item.done", output_index=index, item=item)
