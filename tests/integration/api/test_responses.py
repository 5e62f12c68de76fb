"""OpenAI's Responses API through the real pieces: the `openai` client's `responses.create`,
`responses.stream`, `retrieve` and `cancel`, and `/v1/responses` batch files; API, Redis,
GPU worker (vLLM on CPU) and Postgres. Every response the API sends is also checked
against the client's own `Response` type, field by field (strict validation)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from openai import OpenAI
from openai.types.responses import Response

from tests.conftest import MODEL_NAME, Stack
from tests.helpers.waiting import wait_until
from tests.integration.api.test_batches import client_for, read_lines, upload, wait_for
from tests.integration.api.test_structured import MAX_TOKENS, SENTIMENT, WEATHER_ARGS

pytestmark = pytest.mark.engine

INSTRUCTIONS = "Answer in one short sentence."
QUESTION = "Tell me about the sea."
WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The forecast for a city.",
    "parameters": WEATHER_ARGS,
}
FORCE_WEATHER: Any = {"type": "function", "name": "get_weather"}


def validated(body: dict[str, Any]) -> Response:
    """`body` checked against the `openai` client's `Response` type, every field: each one
    the type has is there (optional ones too), and each has its type's shape."""
    missing = set(Response.model_fields) - set(body)
    assert not missing, f"fields of openai's Response missing: {sorted(missing)}"
    return Response.model_validate(body, strict=False)


def raw_response(stack: Stack, path: str, **kwargs: Any) -> dict[str, Any]:
    with stack.client() as http:
        answer = http.request(kwargs.pop("method", "GET"), path, **kwargs)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def test_a_response_is_the_chat_its_instructions_and_input_make(stack: Stack) -> None:
    client = client_for(stack)
    response = client.responses.create(
        model=MODEL_NAME,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=12,
        temperature=0,
        metadata={"team": "search"},
    )
    chat = client.chat.completions.create(
        model=MODEL_NAME,
        messages=[
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": QUESTION},
        ],
        max_tokens=12,
        temperature=0,
    )
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.output_text == chat.choices[0].message.content
    assert response.usage is not None
    assert chat.usage is not None
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.total_tokens == chat.usage.total_tokens
    # Twelve tokens of random weights end at the limit: the response says so.
    finished = chat.choices[0].finish_reason
    assert response.status == ("incomplete" if finished == "length" else "completed")
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message"
    assert message.role == "assistant"
    assert response.instructions == INSTRUCTIONS
    assert response.max_output_tokens == 12
    assert response.metadata == {"team": "search"}
    assert response.temperature == 0

    # Stored (the default): read back as it was answered, and the job behind it listed.
    stored = raw_response(stack, f"/v1/responses/{response.id}")
    assert validated(stored) == response
    assert client.responses.retrieve(response.id) == response
    job = raw_response(stack, "/v1/jobs/job_" + response.id.removeprefix("resp_"))
    assert job["status"] == "succeeded"


def test_a_streamed_response_sends_openai_events_and_ends_as_the_stored_one(
    stack: Stack,
) -> None:
    client = client_for(stack)
    # A schema that random weights finish within the limit: the stream ends `completed`.
    sentiment = {"format": {"type": "json_schema", "name": "sentiment", "schema": SENTIMENT}}
    params: Any = {"model": MODEL_NAME, "input": QUESTION, "max_output_tokens": MAX_TOKENS}
    params |= {"text": sentiment, "extra_body": {"seed": 3}}  # seed: vLLM's, not OpenAI's
    whole = client.responses.create(**params)
    with client.responses.stream(**params) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == whole.output_text == final.output_text
    assert final.id != whole.id
    assert whole.status == final.status == "completed"
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_a_json_schema_text_format_and_logprobs(stack: Stack) -> None:
    client = client_for(stack)
    response = client.responses.create(
        model=MODEL_NAME,
        input="Rate this review: great food, slow service.",
        text={"format": {"type": "json_schema", "name": "sentiment", "schema": SENTIMENT}},
        max_output_tokens=MAX_TOKENS,
        extra_body={"seed": 4},
        top_logprobs=2,
        include=["message.output_text.logprobs"],
    )
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), SENTIMENT)
    assert response.text is not None
    assert response.text.format.type == "json_schema"
    [message] = response.output
    assert message.type == "message"
    [part] = message.content
    assert part.type == "output_text"
    assert part.logprobs
    # One logprob a generated token: the text's, then the end-of-sequence token's.
    assert "".join(lp.token for lp in part.logprobs).startswith(response.output_text)
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    # Where the schema left one token, the other is ruled out: -9999 (as vLLM's server
    # sends it), not an infinity JSON cannot hold.
    alternatives = [alt.logprob for lp in part.logprobs for alt in lp.top_logprobs]
    assert -9999.0 in alternatives


def test_a_forced_function_call_and_the_conversation_that_continues_it(stack: Stack) -> None:
    client = client_for(stack)
    asked: Any = {
        "model": MODEL_NAME,
        "instructions": INSTRUCTIONS,
        "input": "What will the weather be in Oslo?",
        "tools": [WEATHER_TOOL],
        "tool_choice": FORCE_WEATHER,
        "max_output_tokens": MAX_TOKENS,
        "extra_body": {"seed": 5},
    }
    response = client.responses.create(**asked)
    [call] = response.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER_ARGS)
    assert validated(raw_response(stack, f"/v1/responses/{response.id}")) == response

    # Streamed: the call comes whole, as function-call events, never as text.
    with client.responses.stream(**asked) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert "response.output_text.delta" not in types
    assert types[2:] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    [streamed] = final.output
    assert streamed.type == "function_call"
    assert streamed.arguments == call.arguments

    # The call's output goes back: by previous_response_id, or as the whole conversation
    # in `input`. Both are the same chat, so greedy decoding answers them the same.
    answer: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C"}
    go_on: Any = {"model": MODEL_NAME, "tools": [WEATHER_TOOL], "tool_choice": "none"}
    go_on |= {"max_output_tokens": 10, "temperature": 0, "instructions": INSTRUCTIONS}
    continued = client.responses.create(**go_on, previous_response_id=response.id, input=[answer])
    whole = client.responses.create(
        **go_on,
        input=[
            {"role": "user", "content": asked["input"]},
            call.model_dump(exclude_none=True),
            answer,
        ],
    )
    assert continued.previous_response_id == response.id
    assert continued.output_text == whole.output_text
    assert continued.usage is not None
    assert whole.usage is not None
    assert continued.usage.input_tokens == whole.usage.input_tokens


def test_a_background_response_is_read_back_and_cancelled(stack: Stack) -> None:
    client = client_for(stack)
    queued = client.responses.create(
        model=MODEL_NAME, input=QUESTION, background=True, max_output_tokens=8
    )
    assert queued.status in {"queued", "in_progress"}
    assert queued.background
    assert queued.output == []
    assert queued.usage is None

    def ended() -> Response | None:
        now = client.responses.retrieve(queued.id)
        return now if now.status in {"completed", "incomplete"} else None

    done = wait_until(ended, timeout_s=60, what="the background response ended")
    assert done.output_text
    assert done.usage is not None

    # Another, followed as it streams, is cancelled before it can end (the worker is
    # stopped meanwhile): the stream ends with a `cancelled` error event (in the
    # background, its follower does not own it) and the response reads back cancelled.
    with (
        stack.worker.frozen(),
        client.responses.create(
            model=MODEL_NAME, input=QUESTION, background=True, stream=True, max_output_tokens=8
        ) as stream,
    ):
        events = iter(stream)
        created = next(events)
        assert created.type == "response.created"
        assert client.responses.cancel(created.response.id).status == "cancelled"
        last = list(events)[-1]
    assert last.type == "error"
    assert last.code == "cancelled"
    assert client.responses.retrieve(created.response.id).status == "cancelled"
    with pytest.raises(openai.ConflictError):
        client.responses.cancel(created.response.id)


def test_what_is_not_served_is_refused_with_the_field_to_fix(stack: Stack) -> None:
    client = client_for(stack)
    unstored = client.responses.create(
        model=MODEL_NAME, input=QUESTION, store=False, max_output_tokens=4
    )
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError, match="no stored response"):
        client.responses.create(model=MODEL_NAME, input=QUESTION, previous_response_id=unstored.id)

    refused: list[tuple[dict[str, Any], str]] = [
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input_text",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "function_call_output"),
        ({"input": QUESTION, "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": QUESTION, "background": True, "store": False}, "background needs store"),
        ({"input": QUESTION, "max_output_tokens": 10**6}, "max_output_tokens"),
        ({"input": QUESTION, "truncation": "auto"}, "truncation"),
        (
            {
                "input": QUESTION,
                "tools": [WEATHER_TOOL],
                "tool_choice": {"type": "function", "name": "get_time"},
            },
            "tool_choice.name",
        ),
        (
            {
                "input": QUESTION,
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "s",
                        "schema": {"type": "array", "uniqueItems": True},
                    }
                },
            },
            "text.format.schema",
        ),
    ]
    for body, named in refused:
        with pytest.raises(openai.UnprocessableEntityError) as caught:
            client.responses.create(model=MODEL_NAME, **body)
        assert named in str(caught.value.body), (body, caught.value.body)


def test_a_responses_batch_answers_each_line_with_a_response(stack: Stack) -> None:
    client: OpenAI = client_for(stack)

    def line(i: int, **body: Any) -> dict[str, Any]:
        body = {"model": MODEL_NAME, "input": f"Question {i}", "max_output_tokens": 6} | body
        return {"custom_id": f"r-{i}", "method": "POST", "url": "/v1/responses", "body": body}

    schema_format = {"format": {"type": "json_schema", "name": "sentiment", "schema": SENTIMENT}}
    lines = [
        # Greedy where the text is free: sampled, the random model may end at once, with no
        # text. (Its schema keeps line 1's output whole.)
        line(0, instructions=INSTRUCTIONS, temperature=0),
        line(1, text=schema_format, max_output_tokens=MAX_TOKENS),
        line(
            2,
            input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            temperature=0,
        ),
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/responses",  # type: ignore[arg-type]
        completion_window="24h",
    )
    done = wait_for(client, batch.id)
    assert done.status == "completed", done
    outputs = read_lines(client, done.output_file_id)
    assert [o["custom_id"] for o in outputs] == ["r-0", "r-1", "r-2"]
    responses = [validated(o["response"]["body"]) for o in outputs]
    assert responses[0].instructions == INSTRUCTIONS
    jsonschema.validate(json.loads(responses[1].output_text), SENTIMENT)
    assert all(r.output_text and r.usage for r in responses)

    refused = client.batches.create(
        input_file_id=upload(client, [line(0, previous_response_id="resp_x"), line(1)]),
        endpoint="/v1/responses",  # type: ignore[arg-type]
        completion_window="24h",
    )
    assert refused.status == "failed"  # checked before anything is queued
    assert refused.errors is not None
    assert refused.errors.data is not None
    [error] = refused.errors.data
    assert error.line == 1
    assert error.param == "body.previous_response_id"
