"""Reading tool calls out of a finished chat output, by the request's `tool_choice`.

A forced call (`required`, or a named function) was generated under a JSON schema, so it
is read as JSON here; `auto` leaves the model free, and the model family's own format is
read by vLLM's tool-call parser, which the worker passes in as `parse_auto`.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from inferq.domain.jobs import Choice, JobResult, ToolCall

TOOL_CALLS = "tool_calls"  # the finish reason of a choice that made calls

# From an `auto` output: the text besides the calls, and the calls as (name, arguments).
AutoParser = Callable[[str], tuple[str, list[tuple[str, str]]]]


def call_id() -> str:
    return "call_" + secrets.token_hex(12)


def with_tool_calls(
    result: JobResult, tool_choice: Mapping[str, Any] | None, parse_auto: AutoParser | None
) -> JobResult:
    """`result` with each choice's tool calls read out (unchanged without a tool choice)."""
    if tool_choice is None:
        return result
    choices = tuple(_read(c, tool_choice, parse_auto) for c in result.choices)
    return dataclasses.replace(result, choices=choices)


def _read(choice: Choice, tool_choice: Mapping[str, Any], parse_auto: AutoParser | None) -> Choice:
    kind = tool_choice["type"]
    if kind == "function":
        # The output is the arguments, generated under the function's schema.
        arguments = _json_text(choice.text)
        calls = [] if arguments is None else [(tool_choice["name"], arguments)]
        content = ""
    elif kind == "required":
        calls = _array_calls(choice.text)
        content = ""
    elif parse_auto is None:  # this worker has no parser (INFERQ_TOOL_CALL_PARSER unset)
        return choice
    else:
        content, calls = parse_auto(choice.text)
    if not calls:  # cut short (max_tokens) or no call made: the output stays text
        return choice
    if tool_choice.get("parallel") is False:  # `parallel_tool_calls: false`
        calls = calls[:1]
    return dataclasses.replace(
        choice,
        text=content,
        finish_reason=TOOL_CALLS if choice.finish_reason == "stop" else choice.finish_reason,
        tool_calls=tuple(ToolCall(id=call_id(), name=n, arguments=a) for n, a in calls),
    )


def _json_text(text: str) -> str | None:
    """`text` if it is JSON; JSON of the same value if it is but for control characters
    inside its strings, which the engine's JSON grammar lets through (and Python's and the
    clients' strict parsers refuse); None if it is not JSON (cut short by max_tokens)."""
    try:
        json.loads(text)
    except ValueError:
        try:
            return json.dumps(json.loads(text, strict=False), ensure_ascii=False)
        except ValueError:
            return None
    return text


def _array_calls(text: str) -> list[tuple[str, str]]:
    try:
        calls = json.loads(text, strict=False)
    except ValueError:
        return []
    if not isinstance(calls, list):
        return []
    return [
        (c["name"], json.dumps(c["parameters"], ensure_ascii=False))
        for c in calls
        if isinstance(c, dict) and isinstance(c.get("name"), str) and "parameters" in c
    ]
