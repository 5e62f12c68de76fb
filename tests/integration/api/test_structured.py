"""Structured outputs and tool calls through the real pieces: batch files, jobs and the
online endpoints, the `openai` client, API, Redis, GPU worker (vLLM on CPU, xgrammar) and
Postgres. The tiny model's weights are random: only the grammar makes its output parse."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.conftest import MODEL_NAME, Stack
from tests.integration.api.test_batches import chat_line, client_for, read_lines, upload, wait_for

pytestmark = pytest.mark.engine

# Bounded on purpose: random weights would fill a free string until max_tokens.
SENTIMENT = {
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 10},
    },
    "required": ["label", "score"],
    "additionalProperties": False,
}
RESPONSE_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "sentiment", "schema": SENTIMENT, "strict": True},
}
WEATHER_ARGS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The forecast for a city.",
            "parameters": WEATHER_ARGS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    },
]
FORCE_WEATHER: Any = {"type": "function", "function": {"name": "get_weather"}}
CHAT: Any = [{"role": "user", "content": "What will the weather be in Oslo?"}]
MAX_TOKENS = 400


def completed_outputs(client: openai.OpenAI, lines: list[Any]) -> list[dict[str, Any]]:
    """The output lines of a chat batch of `lines`, which must complete."""
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch = wait_for(client, batch.id)
    assert batch.status == "completed", batch
    return read_lines(client, batch.output_file_id)


def test_every_line_of_a_schema_batch_parses_and_matches_its_schema(stack: Stack) -> None:
    client = client_for(stack)
    lines = [
        chat_line(i, response_format=RESPONSE_FORMAT, max_tokens=MAX_TOKENS, temperature=1.0)
        for i in range(24)
    ]
    outputs = completed_outputs(client, lines)
    assert [o["custom_id"] for o in outputs] == [f"req-{i}" for i in range(24)]
    for output in outputs:
        [choice] = output["response"]["body"]["choices"]
        assert choice["finish_reason"] == "stop", output
        jsonschema.validate(json.loads(choice["message"]["content"]), SENTIMENT)


def test_bad_schemas_are_refused_per_line_before_anything_runs(stack: Stack) -> None:
    client = client_for(stack)
    invalid = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}}
    unsupported = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "array", "uniqueItems": True}},
    }
    lines = [
        chat_line(0, response_format=RESPONSE_FORMAT),
        chat_line(1, response_format=invalid),
        chat_line(2, response_format=unsupported),
        chat_line(3, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert batch.status == "failed"
    assert batch.request_counts is not None
    assert batch.request_counts.total == 0
    assert batch.errors is not None
    errors = {e.line: e for e in batch.errors.data or []}
    assert sorted(errors) == [2, 3, 4]
    assert errors[2].param == "body.response_format.json_schema.schema"
    assert "not a valid JSON schema" in (errors[2].message or "")
    assert "(custom_id 'req-1')" in (errors[2].message or "")
    assert "uniqueItems" in (errors[3].message or "")
    assert errors[4].param == "body.tool_choice.function.name"


def test_jobs_take_json_object_choices_and_regexes(stack: Stack) -> None:
    with stack.client() as client:
        asked = {
            "json_object": {"response_format": {"type": "json_object"}},
            "choice": {"structured_outputs": {"choice": ["yes", "no", "maybe"]}},
            "regex": {"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}},
            # Past the checks at submission (it has its start rule), refused by the engine.
            "bad_grammar": {"structured_outputs": {"grammar": "root ::= missing_rule"}},
        }
        jobs = {
            name: client.post(
                "/v1/jobs",
                json={"prompt": "Answer:", "max_tokens": MAX_TOKENS, "seed": 3, **fields},
            )
            for name, fields in asked.items()
        }
        assert {name: r.status_code for name, r in jobs.items()} == dict.fromkeys(asked, 202)
        done = {
            name: client.get(f"/v1/jobs/{r.json()['id']}", params={"wait": 60}).json()
            for name, r in jobs.items()
        }
    refused = done.pop("bad_grammar")
    assert refused["status"] == "failed", refused
    assert "the engine refused the request" in refused["error"]["message"]
    texts = {name: job["choices"][0]["text"] for name, job in done.items()}
    # Any JSON object: random weights may fill a string until max_tokens, so the object
    # is whole only if the output stopped on its own.
    json_object = done["json_object"]["choices"][0]
    assert json_object["text"].startswith("{"), json_object
    if json_object["finish_reason"] == "stop":
        assert isinstance(json.loads(json_object["text"]), dict), json_object
    else:
        assert json_object["finish_reason"] == "length", json_object
    assert texts["choice"] in {"yes", "no", "maybe"}
    assert len(texts["regex"]) == 6
    assert texts["regex"][3] == "-"
    assert texts["regex"][:3].isdigit()
    assert done["regex"]["params"]["structured"] == {"regex": "[0-9]{3}-[a-z]{2}"}


def test_online_json_schema_streamed_and_not(stack: Stack) -> None:
    client = client_for(stack)
    params: Any = {
        "model": MODEL_NAME,
        "messages": CHAT,
        "response_format": RESPONSE_FORMAT,
        "max_tokens": MAX_TOKENS,
        "seed": 11,
    }
    whole = client.chat.completions.create(**params)
    content = whole.choices[0].message.content
    assert content is not None
    jsonschema.validate(json.loads(content), SENTIMENT)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**params, stream=True)
        if chunk.choices
    )
    assert streamed == content
    with pytest.raises(openai.UnprocessableEntityError) as refused:
        client.chat.completions.create(
            **{
                **params,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "strin"}},
                },
            }
        )
    assert refused.value.body["param"] == "response_format.json_schema.schema"  # type: ignore[index]


def test_a_forced_tool_call_comes_back_as_tool_calls(stack: Stack) -> None:
    client = client_for(stack)
    params: Any = {
        "model": MODEL_NAME,
        "messages": CHAT,
        "tools": TOOLS,
        "tool_choice": FORCE_WEATHER,
        "max_tokens": MAX_TOKENS,
        "seed": 5,
    }
    completion = client.chat.completions.create(**params)
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function"
    assert call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_ARGS)

    # Streamed: the call arrives as OpenAI's tool_calls deltas, never as content.
    chunks = list(client.chat.completions.create(**params, stream=True))
    deltas = [c.choices[0] for c in chunks if c.choices]
    assert not any(d.delta.content for d in deltas)
    streamed_calls = [tc for d in deltas for tc in d.delta.tool_calls or []]
    assert [(tc.index, tc.function.name) for tc in streamed_calls] == [(0, "get_weather")]  # type: ignore[union-attr]
    assert streamed_calls[0].function.arguments == call.function.arguments  # type: ignore[union-attr]
    assert deltas[-1].finish_reason == "tool_calls"

    # The call and its answer go back into the conversation.
    follow_up = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[
            *CHAT,
            {"role": "assistant", "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
        tools=TOOLS,
        tool_choice="none",
        max_tokens=8,
    )
    assert follow_up.choices[0].message.tool_calls is None


def test_required_tool_choice_and_forced_calls_in_a_batch(stack: Stack) -> None:
    client = client_for(stack)
    lines = [
        chat_line(i, messages=CHAT, tools=TOOLS, tool_choice=FORCE_WEATHER, max_tokens=MAX_TOKENS)
        for i in range(4)
    ]
    for output in completed_outputs(client, lines):
        [choice] = output["response"]["body"]["choices"]
        assert choice["finish_reason"] == "tool_calls"
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER_ARGS)

    with stack.client() as http:
        job = http.post(
            "/v1/jobs",
            json={
                "messages": CHAT,
                "tools": TOOLS,
                "tool_choice": "required",
                "max_tokens": MAX_TOKENS,
                "seed": 2,
            },
        ).json()
        done = http.get(f"/v1/jobs/{job['id']}", params={"wait": 60}).json()
    [choice] = done["choices"]
    assert choice["finish_reason"] == "tool_calls", choice
    assert choice["tool_calls"]
    # In OpenAI's shape, as in the chat completion.
    assert {call["type"] for call in choice["tool_calls"]} == {"function"}
    assert {call["function"]["name"] for call in choice["tool_calls"]} <= {
        "get_weather",
        "get_time",
    }
