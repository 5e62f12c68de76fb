"""Tool calls read out of a finished chat by its `tool_choice`: a forced call is always a
call when its output is the JSON its schema made, even where that JSON holds control
characters in a string (the engine's JSON grammar lets them through; strict parsers, the
clients' too, refuse them)."""

from __future__ import annotations

import json

from inferq.domain.jobs import Choice, JobResult
from worker.engine.tool_calls import with_tool_calls

NAMED = {"type": "function", "name": "get_weather"}


def _read(text: str, tool_choice: dict[str, str], finish: str = "stop") -> Choice:
    result = JobResult(
        choices=(Choice(index=0, text=text, finish_reason=finish, completion_tokens=9),),
        prompt_tokens=3,
    )
    return with_tool_calls(result, tool_choice, None).choices[0]


def test_a_named_call_keeps_its_json_as_generated() -> None:
    choice = _read('{"city": "Oslo"}', NAMED)
    assert choice.finish_reason == "tool_calls"
    assert choice.text == ""
    assert choice.tool_calls is not None
    assert [(c.name, c.arguments) for c in choice.tool_calls] == [
        ("get_weather", '{"city": "Oslo"}')
    ]


def test_control_characters_in_a_string_still_make_a_call_with_strict_json() -> None:
    choice = _read('{\n  "city": "O\x03slo\t"}', NAMED)
    assert choice.tool_calls is not None
    (call,) = choice.tool_calls
    assert json.loads(call.arguments) == {"city": "O\x03slo\t"}  # strict: escaped now


def test_required_calls_with_control_characters_are_read_too() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "a\x02b"}}]'
    choice = _read(text, {"type": "required"})
    assert choice.tool_calls is not None
    assert json.loads(choice.tool_calls[0].arguments) == {"city": "a\x02b"}


def test_output_cut_short_stays_text() -> None:
    choice = _read('{"city": "Os', NAMED, finish="length")
    assert choice.tool_calls is None
    assert choice.text == '{"city": "Os'
    assert choice.finish_reason == "length"
