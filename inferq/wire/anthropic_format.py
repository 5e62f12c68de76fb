"""Anthropic's response shapes: a message, the events of a streamed one, a message batch
and a line of its results.

A message's id is its job's id with another prefix (`msg_…`). A stop sequence and the
end of the turn both end a job as `stop`, and which stop sequence matched is not kept:
both read as `end_turn`, with `stop_sequence` null.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from inferq.constants import JOB_ID_PREFIX
from inferq.domain.batches import Batch, BatchStatus, ResultRow
from inferq.domain.jobs import JobStatus

MESSAGE_ID_PREFIX = "msg_"
EXPIRED_CODE = "batch_expired"

# A batch's outcome counts by (status, error code): `BatchStore.outcomes`.
Outcomes = Mapping[tuple[JobStatus, str | None], int]


def message_id(job_id: str) -> str:
    return MESSAGE_ID_PREFIX + job_id.removeprefix(JOB_ID_PREFIX)


def stop_reason(finish_reason: str | None) -> str | None:
    """Anthropic's `stop_reason` for a job's finish reason."""
    if finish_reason is None:
        return None
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(finish_reason, "end_turn")


def usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def content(text: str, calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A message's content blocks: its text (unless it only made calls), then a
    `tool_use` block for each call (as `ToolCall.to_dict` gives them)."""
    blocks = [{"type": "text", "text": text}] if text or not calls else []
    return blocks + [_tool_use(call) for call in calls]


def _tool_use(call: Mapping[str, Any]) -> dict[str, Any]:
    try:
        given = json.loads(call["arguments"])
    except ValueError:
        given = None
    return {
        "type": "tool_use",
        "id": call["id"],
        "name": call["name"],
        "input": given if isinstance(given, dict) else {},
    }


def message_body(
    *,
    job_id: str,
    model: str,
    blocks: list[dict[str, Any]],
    finish_reason: str | None,
    input_tokens: int,
    output_tokens: int,
) -> dict[str, Any]:
    """The `message` a client gets for a request (`blocks` from `content`)."""
    return {
        "id": message_id(job_id),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": blocks,
        "stop_reason": stop_reason(finish_reason),
        "stop_sequence": None,
        "usage": usage(input_tokens, output_tokens),
    }


def error_event(message: str, *, type_: str) -> dict[str, Any]:
    """Anthropic's error body (also the `error` event of a stream)."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def message_start(*, job_id: str, model: str, input_tokens: int) -> dict[str, Any]:
    """The event that opens a streamed message: the message, with no content yet."""
    message = message_body(
        job_id=job_id,
        model=model,
        blocks=[],
        finish_reason=None,
        input_tokens=input_tokens,
        output_tokens=0,
    )
    return {"type": "message_start", "message": message}


def text_start(index: int = 0) -> dict[str, Any]:
    block = {"type": "text", "text": ""}
    return {"type": "content_block_start", "index": index, "content_block": block}


def text_delta(text: str, index: int = 0) -> dict[str, Any]:
    delta = {"type": "text_delta", "text": text}
    return {"type": "content_block_delta", "index": index, "delta": delta}


def block_stop(index: int = 0) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def whole_blocks(text: str, calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The events of content sent whole once it has ended: each block started, given
    (a tool call's input as one `input_json_delta`) and stopped."""
    events: list[dict[str, Any]] = []
    for index, block in enumerate(content(text, calls)):
        if block["type"] == "text":
            events += [text_start(index), text_delta(block["text"], index)]
        else:
            started = {**block, "input": {}}
            partial = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events += [
                {"type": "content_block_start", "index": index, "content_block": started},
                {"type": "content_block_delta", "index": index, "delta": partial},
            ]
        events.append(block_stop(index))
    return events


def message_end(*, finish_reason: str | None, output_tokens: int) -> list[dict[str, Any]]:
    """The events that close a streamed message: its stop reason and usage, the stop."""
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(finish_reason), "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def _rfc3339(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat().replace("+00:00", "Z")


def processing_status(status: BatchStatus) -> str:
    if status is BatchStatus.CANCELLING:
        return "canceling"
    return "ended" if status.is_terminal else "in_progress"


def _ended_at(batch: Batch) -> datetime | None:
    if not batch.status.is_terminal:
        return None
    if batch.status is BatchStatus.EXPIRED:
        return batch.expired_at
    return batch.completed_at or batch.cancelled_at or batch.failed_at


def request_counts(batch: Batch, outcomes: Outcomes | None) -> dict[str, int]:
    """Anthropic's tallies: every request is `processing` until the batch has ended."""
    counts = {"processing": 0, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0}
    if outcomes is None:
        counts["processing"] = batch.counts.total
        return counts
    for (status, code), count in outcomes.items():
        counts[_result_type(status, code)] += count
    return counts


def message_batch(
    batch: Batch, *, outcomes: Outcomes | None, results_url: str | None
) -> dict[str, Any]:
    """A `message_batch`; `outcomes` and `results_url` once it has ended."""
    return {
        "id": batch.id,
        "type": "message_batch",
        "processing_status": processing_status(batch.status),
        "request_counts": request_counts(batch, outcomes),
        "created_at": _rfc3339(batch.created_at),
        "expires_at": _rfc3339(batch.expires_at),
        "ended_at": _rfc3339(_ended_at(batch)),
        "cancel_initiated_at": _rfc3339(batch.cancelling_at),
        "archived_at": None,
        "results_url": results_url,
    }


def _result_type(status: JobStatus, code: str | None) -> str:
    if status is JobStatus.SUCCEEDED:
        return "succeeded"
    if status is JobStatus.CANCELLED:
        return "expired" if code == EXPIRED_CODE else "canceled"
    return "errored"


def result_message(row: ResultRow) -> dict[str, Any]:
    """The message a succeeded batch line made."""
    [choice] = row.choices or [{"text": "", "finish_reason": None}]
    return message_body(
        job_id=row.job_id,
        model=row.model,
        blocks=content(choice["text"], choice.get("tool_calls") or ()),
        finish_reason=choice["finish_reason"],
        input_tokens=row.prompt_tokens,
        output_tokens=row.completion_tokens or 0,
    )


def result_line(row: ResultRow) -> dict[str, Any]:
    """One line of a message batch's results: the message, or why there is none."""
    kind = _result_type(row.status, (row.error or {}).get("code"))
    result: dict[str, Any] = {"type": kind}
    if kind == "succeeded":
        result["message"] = result_message(row)
    elif kind == "errored":
        message = (row.error or {}).get("message", "the request failed")
        result["error"] = error_event(message, type_="api_error")
    return {"custom_id": row.custom_id, "result": result}
