"""Anthropic's Messages API through the official `anthropic` client, unchanged but for its
base URL: a chat job on the real stack (API, Redis, GPU worker with vLLM on CPU, Postgres),
answered whole or streamed as Anthropic's events."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest
from openai import OpenAI

from tests.conftest import ADMIN_KEY, MODEL_NAME, Stack
from tests.helpers.processes import log_contains
from tests.helpers.waiting import wait_until
from tests.integration.api.conftest import AnthropicClients

pytestmark = pytest.mark.engine

SYSTEM = "You answer briefly."
QUESTION = "Tell me about the sea."


def greedy(**extra: Any) -> dict[str, Any]:
    """A request with greedy sampling (`temperature`, which this `anthropic` release no
    longer names, goes as an extra field; older releases send it as a keyword)."""
    return {
        "model": MODEL_NAME,
        "max_tokens": 12,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}],
        "extra_body": {"temperature": 0, "top_k": 5},
        **extra,
    }


def test_a_message_is_the_chat_completion_of_the_same_turns(
    stack: Stack, anthropic_clients: AnthropicClients
) -> None:
    message = anthropic_clients().messages.create(**greedy())
    with OpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY, max_retries=0) as openai:
        completion = openai.chat.completions.create(
            model=MODEL_NAME,
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": QUESTION},
            ],
            max_tokens=12,
            temperature=0,
        )
    assert completion.usage is not None
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.model == MODEL_NAME
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == completion.choices[0].message.content
    assert message.usage.input_tokens == completion.usage.prompt_tokens
    assert message.usage.output_tokens == completion.usage.completion_tokens
    assert (
        message.stop_reason
        == {"length": "max_tokens", "stop": "end_turn"}[completion.choices[0].finish_reason]
    )
    counted = anthropic_clients().messages.count_tokens(
        model=MODEL_NAME, system=SYSTEM, messages=greedy()["messages"]
    )
    assert counted.input_tokens == message.usage.input_tokens
    # The job that answered it is listed with the caller's other jobs.
    job_id = "job_" + message.id.removeprefix("msg_")
    with stack.client() as http:
        job = http.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded"
    assert (job["params"]["temperature"], job["params"]["top_k"]) == (0, 5)


def test_a_streamed_message_sends_anthropics_events_and_the_same_text(
    stack: Stack, anthropic_clients: AnthropicClients
) -> None:
    client = anthropic_clients()
    whole = client.messages.create(**greedy())
    with client.messages.stream(**greedy()) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert "content_block_delta" in kinds
    assert final.content[0].text == whole.content[0].text  # type: ignore[union-attr]
    assert final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens
    # create(stream=True) gives the same events, raw (the text cut where it came).
    events = list(client.messages.create(**greedy(), stream=True))
    assert [e.type for e in events if e.type != "content_block_delta"] == [
        k for k in kinds if k not in ("text", "content_block_delta")
    ]
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == whole.content[0].text


def test_the_key_may_come_in_x_api_key(stack: Stack) -> None:
    key = stack.new_key()
    body = greedy(max_tokens=2)
    body.update(body.pop("extra_body"))
    with httpx.Client(base_url=stack.url, timeout=120) as http:
        answered = http.post("/v1/messages", json=body, headers={"x-api-key": key})
        refused = http.post("/v1/messages", json=body, headers={"x-api-key": "iq_wrong"})
        missing = http.post("/v1/messages", json=body)
    assert answered.status_code == 200, answered.text
    assert answered.json()["usage"]["output_tokens"] == 2
    assert refused.status_code == 401
    assert "x-api-key" in missing.json()["error"]["message"]


def test_what_cannot_be_honoured_is_refused_naming_it_and_the_rest_is_ignored(
    stack: Stack, anthropic_clients: AnthropicClients
) -> None:
    client = anthropic_clients()
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    turn = {"role": "user", "content": [{"type": "text", "text": QUESTION}, image]}
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        client.messages.create(**greedy(messages=[turn]))
    assert refused.value.body["error"]["param"] == "messages.0.content.1"  # type: ignore[index]
    server_tool = {"type": "web_search_20250305", "name": "web_search"}
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        client.messages.create(**greedy(tools=[server_tool]))
    assert refused.value.body["error"]["param"] == "tools.0"  # type: ignore[index]
    message = client.messages.create(
        **greedy(max_tokens=3, extra_body={"temperature": 0, "a_field_from_tomorrow": 1}),
        metadata={"user_id": "u-1"},
        thinking={"type": "disabled"},
    )
    assert message.usage.output_tokens == 3
    shaped = client.messages.create(
        **greedy(max_tokens=8),
        output_config={"format": {"type": "json_schema", "schema": {"enum": ["yes", "no"]}}},
    )
    assert json.loads(shaped.content[0].text) in ("yes", "no")
    wait_until(
        log_contains(stack.api, "ignored field 'a_field_from_tomorrow'"),
        timeout_s=10,
        what="the ignored field logged",
    )


@pytest.mark.parametrize(
    ("field", "param"),
    [("system", "system"), ("question", "messages.0.content")],
)
def test_text_that_is_not_unicode_is_refused_naming_its_field(
    stack: Stack, field: str, param: str
) -> None:
    texts = {"system": SYSTEM, "question": QUESTION, field: "an unpaired \ud800 surrogate"}
    body = {
        "model": MODEL_NAME,
        "max_tokens": 2,
        "system": texts["system"],
        "messages": [{"role": "user", "content": texts["question"]}],
    }
    with stack.client() as http:
        # Escaped JSON (`\ud800`) is how such a string reaches a server.
        refused = http.post(
            "/v1/messages",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"]["param"] == param


WEATHER = {
    "name": "get_weather",
    "description": "The forecast for a city.",
    "input_schema": {
        "type": "object",
        "properties": {
            "city": {"enum": ["Paris", "Oslo", "Lima"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
    },
}


def test_a_forced_tool_call_is_a_tool_use_block_whole_or_streamed(
    anthropic_clients: AnthropicClients,
) -> None:
    client = anthropic_clients()
    asked: dict[str, Any] = {
        "model": MODEL_NAME,
        "max_tokens": 400,
        "messages": [{"role": "user", "content": "What will the weather be in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": {"seed": 5},
    }
    message = client.messages.create(**asked)
    assert message.stop_reason == "tool_use"
    [use] = [block for block in message.content if block.type == "tool_use"]
    assert use.name == "get_weather"
    assert use.input["city"] in ("Paris", "Oslo", "Lima")  # type: ignore[index]
    assert 1 <= use.input["days"] <= 7  # type: ignore[index]
    with client.messages.stream(**asked) as stream:
        streamed = stream.get_final_message()
    [streamed_use] = [block for block in streamed.content if block.type == "tool_use"]
    assert streamed.stop_reason == "tool_use"
    assert (streamed_use.name, streamed_use.input) == (use.name, use.input)
    # The call and its result go back as the conversation goes on.
    follow_up = client.messages.create(
        model=MODEL_NAME,
        max_tokens=4,
        messages=[
            asked["messages"][0],
            {"role": "assistant", "content": [use.model_dump()]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"},
                    {"type": "text", "text": "And tomorrow?"},
                ],
            },
        ],
        tools=[WEATHER],
        tool_choice={"type": "none"},
    )
    assert [block.type for block in follow_up.content] == ["text"]
    assert follow_up.usage.input_tokens > message.usage.input_tokens
