"""OpenAI's `response` object (`/v1/responses`), rendered from a job or from a batch line's
result row: its status, output items (the message and function calls), usage and what it
echoes of the request. The request side is `inferq.wire.responses`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Self

from inferq.constants import JOB_ID_PREFIX
from inferq.domain.jobs import Job, JobStatus
from inferq.wire.openai_format import chat_logprobs
from inferq.wire.responses import RESPONSE_STATUSES, response_id


@dataclasses.dataclass(frozen=True, kw_only=True)
class ResponseState:
    """What a response object is rendered from: a job, or a batch line's result row."""

    job_id: str
    status: JobStatus
    model: str
    created_at: datetime
    finished_at: datetime | None
    sampling: Mapping[str, Any]
    echo: Mapping[str, Any]
    metadata: Mapping[str, Any]
    choices: Sequence[Mapping[str, Any]] | None
    prompt_tokens: int
    completion_tokens: int | None
    error: Mapping[str, str] | None

    @classmethod
    def of_job(cls, job: Job) -> Self:
        assert job.response is not None, "a job made by the Responses API"
        return cls(
            job_id=job.id,
            status=job.status,
            model=job.model,
            created_at=job.created_at,
            finished_at=job.finished_at,
            sampling=job.sampling.to_dict(),
            echo=job.response,
            metadata=job.metadata,
            choices=[c.to_dict() for c in job.result.choices] if job.result else None,
            prompt_tokens=job.prompt_tokens,
            completion_tokens=sum(c.completion_tokens for c in job.result.choices)
            if job.result
            else None,
            error=job.error.to_dict() if job.error else None,
        )


def response_object(state: ResponseState) -> dict[str, Any]:
    """The `response` a client gets: OpenAI's shape, field by field."""
    echo = state.echo
    incomplete = False
    output: list[dict[str, Any]] = []
    if state.choices:
        choice = state.choices[0]
        incomplete = choice.get("finish_reason") == "length"
        output = output_items(
            state.job_id, choice, status="incomplete" if incomplete else "completed"
        )
    status = RESPONSE_STATUSES[state.status]
    if state.status is JobStatus.SUCCEEDED and incomplete:
        status = "incomplete"
    usage = None
    if state.choices is not None:
        usage = response_usage(state.prompt_tokens, state.completion_tokens or 0)
    error = None
    if state.status is JobStatus.FAILED:
        reason = state.error or {"code": "failed", "message": "the request failed"}
        error = {"code": "server_error", "message": f"{reason['code']}: {reason['message']}"}
    ended = state.finished_at if state.status.is_terminal else None
    return {
        "id": response_id(state.job_id),
        "object": "response",
        "created_at": int(state.created_at.timestamp()),
        "status": status,
        "completed_at": int(ended.timestamp()) if ended and status == "completed" else None,
        "background": echo.get("background", False),
        "error": error,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "metadata": dict(state.metadata),
        "model": state.model,
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "previous_response_id": echo.get("previous_response_id"),
        "service_tier": echo.get("service_tier", "default"),
        "store": echo.get("store", True),
        "temperature": state.sampling.get("temperature", 1.0),
        "text": echo.get("text", {"format": {"type": "text"}}),
        "tool_choice": echo.get("tool_choice", "none"),
        "tools": list(echo.get("tools", [])),
        "top_logprobs": echo.get("top_logprobs"),
        "top_p": state.sampling.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": echo.get("user"),
        "safety_identifier": echo.get("safety_identifier"),
        "prompt_cache_key": echo.get("prompt_cache_key"),
        # The rest of OpenAI's fields, for what inferq does not do: a client's type has
        # them all.
        "access_programs": None,
        "conversation": None,
        "image": None,
        "input_transformations": None,
        "max_tool_calls": None,
        "moderation": None,
        "prompt": None,
        "prompt_cache_diagnostics": None,
        "prompt_cache_options": None,
        "prompt_cache_retention": None,
        "reasoning": None,
        "tool_usage": None,
    }


def response_usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def output_items(
    job_id: str, choice: Mapping[str, Any], *, status: str = "completed"
) -> list[dict[str, Any]]:
    """A finished choice as output items: its message (if it said anything or called
    nothing), then its function calls."""
    calls = choice.get("tool_calls") or []
    items = []
    if choice["text"] or not calls:
        items.append(message_item(job_id, choice["text"], choice.get("logprobs"), status=status))
    items.extend(function_call_item(job_id, i, call) for i, call in enumerate(calls))
    return items


def message_item(
    job_id: str,
    text: str | None,
    logprobs: list[dict[str, Any]] | None,
    *,
    status: str = "completed",
) -> dict[str, Any]:
    """The assistant's message; without `text`, as it starts (no content yet)."""
    suffix = job_id.removeprefix(JOB_ID_PREFIX)
    content = [] if text is None else [output_text(text, logprobs)]
    item_id = f"msg_{suffix}"
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": content,
    }


def output_text(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": response_logprobs(logprobs),
    }


def response_logprobs(entries: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    rendered = chat_logprobs(entries)
    return [] if rendered is None else rendered["content"]


def function_call_item(
    job_id: str, index: int, call: Mapping[str, Any], *, arguments: str | None = None
) -> dict[str, Any]:
    """One function call; with `arguments` given, as it starts streaming."""
    suffix = job_id.removeprefix(JOB_ID_PREFIX)
    return {
        "id": f"fc_{suffix}_{index}",
        "type": "function_call",
        "call_id": call["id"],
        "name": call["name"],
        "arguments": call["arguments"] if arguments is None else arguments,
        "status": "completed" if arguments is None else "in_progress",
    }
