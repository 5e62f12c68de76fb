"""OpenAI's response shapes for chat and text completions, whole and as stream chunks.

Used by the online endpoints and by batch output files, so a result reads the same
wherever it is fetched. Choices come as `Choice.to_dict()` gives them; a job's
completion id is its job id with another prefix (`chatcmpl-…`, `cmpl-…`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from inferq.constants import JOB_ID_PREFIX


def completion_id(job_id: str, *, chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + job_id.removeprefix(JOB_ID_PREFIX)


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion_body(
    *,
    job_id: str,
    chat: bool,
    created: int,
    model: str,
    choices: Sequence[dict[str, Any]],
    prompt_tokens: int,
    completion_tokens: int,
    service_tier: str | None = None,
) -> dict[str, Any]:
    """The `chat.completion` or `text_completion` a client gets for a finished request
    (with the `service_tier` it ran at, online)."""
    tier = {} if service_tier is None else {"service_tier": service_tier}
    if chat:
        return {
            "id": completion_id(job_id, chat=True),
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": c["index"],
                    "message": chat_message(c),
                    "finish_reason": c["finish_reason"],
                    "logprobs": chat_logprobs(c.get("logprobs")),
                }
                for c in choices
            ],
            "usage": usage(prompt_tokens, completion_tokens),
            "system_fingerprint": None,
            **tier,
            **_prompt_logprobs(choices[0] if choices else {}),
        }
    return {
        "id": completion_id(job_id, chat=False),
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": c["index"],
                "text": c["text"],
                "finish_reason": c["finish_reason"],
                "logprobs": completion_logprobs(c.get("logprobs")),
                **_prompt_logprobs(c),
            }
            for c in choices
        ],
        "usage": usage(prompt_tokens, completion_tokens),
        **tier,
    }


def _prompt_logprobs(choice: dict[str, Any]) -> dict[str, Any]:
    """The prompt's logprobs where they were asked for (vLLM's field: on a chat completion,
    on each choice of a text completion), as vLLM's server sends them; nothing otherwise."""
    positions = choice.get("prompt_logprobs")
    return {} if positions is None else {"prompt_logprobs": positions}


def chat_message(choice: dict[str, Any]) -> dict[str, Any]:
    """A chat choice's `message`: its text, and its tool calls if it made any."""
    calls = choice.get("tool_calls")
    if not calls:
        return {"role": "assistant", "content": choice["text"]}
    return {
        "role": "assistant",
        "content": choice["text"] or None,
        "tool_calls": [tool_call(call) for call in calls],
    }


def tool_call(call: dict[str, Any], *, index: int | None = None) -> dict[str, Any]:
    """A stored call in OpenAI's shape (with its `index` in a stream chunk)."""
    rendered = {
        "id": call["id"],
        "type": "function",
        "function": {"name": call["name"], "arguments": call["arguments"]},
    }
    return rendered if index is None else {"index": index, **rendered}


def chunk(
    *,
    job_id: str,
    chat: bool,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    with_usage: bool,
    usage_: dict[str, int] | None = None,
    service_tier: str | None = None,
) -> dict[str, Any]:
    """One `chat.completion.chunk` or streamed `text_completion`. With `with_usage` (the
    client asked for `stream_options.include_usage`) it carries `usage`: null but on the
    last chunk, as OpenAI's do."""
    body: dict[str, Any] = {
        "id": completion_id(job_id, chat=chat),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if service_tier is not None:
        body["service_tier"] = service_tier
    if with_usage:
        body["usage"] = usage_
    return body


def chat_role_choice(index: int) -> dict[str, Any]:
    """A chat stream's first chunk for a choice: who speaks."""
    return {
        "index": index,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }


def chunk_choice(
    *,
    chat: bool,
    index: int,
    text: str,
    logprobs: list[dict[str, Any]] | None,
    finish_reason: str | None,
    text_offset: int,
) -> dict[str, Any]:
    """New text of one choice; `text_offset` is where it starts in the choice's text."""
    if chat:
        return {
            "index": index,
            "delta": {"content": text} if text or finish_reason is None else {},
            "logprobs": chat_logprobs(logprobs),
            "finish_reason": finish_reason,
        }
    return {
        "index": index,
        "text": text,
        "logprobs": completion_logprobs(logprobs, start=text_offset),
        "finish_reason": finish_reason,
    }


def chat_logprobs(entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    if entries is None:
        return None
    return {
        "content": [
            {
                "token": e["token"],
                "logprob": e["logprob"],
                "bytes": list(e["token"].encode()),
                "top_logprobs": [
                    {
                        "token": t["token"],
                        "logprob": t["logprob"],
                        "bytes": list(t["token"].encode()),
                    }
                    for t in e["top_logprobs"]
                ],
            }
            for e in entries
        ]
    }


def completion_logprobs(
    entries: list[dict[str, Any]] | None, *, start: int = 0
) -> dict[str, Any] | None:
    if entries is None:
        return None
    offsets, position = [], start
    for e in entries:
        offsets.append(position)
        position += len(e["token"])
    return {
        "tokens": [e["token"] for e in entries],
        "token_logprobs": [e["logprob"] for e in entries],
        "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
        "text_offset": offsets,
    }
