"""Structured outputs and tools, checked at submission: the constraint each request shape
becomes, the refusals (each naming its field), and tool calls read out of outputs,
with vLLM's real `llama3_json` parser on the tiny model's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from inferq.domain.jobs import Choice, JobResult
from inferq.exceptions import InvalidRequest
from inferq.wire.messages import ChatMessage
from inferq.wire.prompts import PromptRenderer
from inferq.wire.public import ChoicePublic
from inferq.wire.sampling_fields import SamplingFields
from inferq.wire.validation import JobValidator
from worker.engine.tool_calls import with_tool_calls

SCHEMA = {
    "type": "object",
    "properties": {"label": {"enum": ["positive", "negative"]}, "score": {"type": "integer"}},
    "required": ["label", "score"],
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time"}}
CHAT = [ChatMessage(role="user", content="What is the weather in Paris?")]


@pytest.fixture
def validator(renderer: PromptRenderer) -> JobValidator:
    return JobValidator(
        renderer,
        model_name="tiny",
        default_max_tokens=64,
        max_n=4,
        max_tokens_cap=2048,
        tool_call_parser="llama3_json",
    )


def spec(validator: JobValidator, *, chat: bool = True, **fields: Any):  # type: ignore[no-untyped-def]
    return validator.spec(
        model=None,
        prompt=None if chat else "Classify: the sea is calm.",
        messages=CHAT if chat else None,
        sampling=SamplingFields.model_validate(fields),
        metadata={},
    )


def refusal(validator: JobValidator, **fields: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        spec(validator, **fields)
    return caught.value


def test_each_response_format_becomes_the_engines_constraint(validator: JobValidator) -> None:
    schema_format = {"type": "json_schema", "json_schema": {"name": "label", "schema": SCHEMA}}
    assert spec(validator, response_format=schema_format).sampling.structured == {"json": SCHEMA}
    assert spec(validator, response_format={"type": "json_object"}).sampling.structured == {
        "json_object": True
    }
    assert spec(validator, response_format={"type": "text"}).sampling.structured is None
    # And on a raw prompt too.
    assert spec(validator, chat=False, structured_outputs={"choice": ["yes", "no"]}).sampling
    for extension in ({"regex": "[0-9]{3}"}, {"choice": ["a", "b"]}, {"grammar": 'root ::= "x"'}):
        assert spec(validator, structured_outputs=extension).sampling.structured == extension
    assert spec(validator, structured_outputs={"json": SCHEMA}).sampling.structured == {
        "json": SCHEMA
    }


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strin"}}},
            "response_format.json_schema.schema",
            "not a valid JSON schema",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
                },
            },
            "response_format.json_schema.schema",
            "uniqueItems (at /) is not supported",
        ),
        (
            {
                "type": "json_schema",
                "json_schema": {
                    "name": "x",
                    "schema": {
                        "type": "object",
                        "properties": {"n": {"type": "number", "multipleOf": 5}},
                    },
                },
            },
            "response_format.json_schema.schema",
            "multipleOf (at /properties/n)",
        ),
    ],
)
def test_schemas_the_engine_cannot_enforce_are_refused_naming_the_field(
    validator: JobValidator, fields: dict[str, Any], param: str, words: str
) -> None:
    refused = refusal(validator, response_format=fields)
    assert refused.param == param
    assert words in refused.message


def test_bad_extensions_and_conflicts_are_refused(validator: JobValidator) -> None:
    assert refusal(validator, structured_outputs={"regex": "a(b"}).param == (
        "structured_outputs.regex"
    )
    assert refusal(validator, structured_outputs={"regex": "(?=a)b"}).param == (
        "structured_outputs.regex"
    )
    assert refusal(validator, structured_outputs={"grammar": "foo ::= 'x'"}).param == (
        "structured_outputs.grammar"
    )
    both = refusal(
        validator, response_format={"type": "json_object"}, structured_outputs={"choice": ["a"]}
    )
    assert both.param == "structured_outputs"
    with pytest.raises(ValueError, match="exactly one"):
        SamplingFields.model_validate({"structured_outputs": {"regex": "a", "choice": ["a"]}})


def test_tools_render_in_the_prompt_and_a_named_choice_constrains_to_its_arguments(
    validator: JobValidator, renderer: PromptRenderer
) -> None:
    plain = spec(validator)
    named = spec(
        validator,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    # The tools are in the prompt the model sees, through its chat template.
    assert len(named.prompt_token_ids) > len(plain.prompt_token_ids)
    text = renderer.chat_text(named.messages or [], tools=[WEATHER])
    assert '"get_weather"' in text
    assert named.sampling.structured == {"json": WEATHER["function"]["parameters"]}  # type: ignore[index]
    assert named.sampling.tool_choice == {"type": "function", "name": "get_weather"}

    required = spec(validator, tools=[WEATHER, TIME], tool_choice="required")
    assert required.sampling.tool_choice == {"type": "required"}
    calls = required.sampling.structured["json"]  # type: ignore[index]
    assert calls["type"] == "array"
    assert calls["minItems"] == 1
    assert spec(validator, tools=[WEATHER]).sampling.tool_choice == {"type": "auto"}
    assert spec(validator, tools=[WEATHER], tool_choice="none").sampling.tool_choice is None


def test_tool_mistakes_are_refused_naming_the_field(
    validator: JobValidator, renderer: PromptRenderer
) -> None:
    unknown = refusal(
        validator, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}}
    )
    assert unknown.param == "tool_choice.function.name"
    assert refusal(validator, tool_choice="auto").param == "tool_choice"
    assert refusal(validator, chat=False, tools=[WEATHER]).param == "tools"
    assert refusal(validator, tools=[WEATHER, WEATHER]).param == "tools"
    forced_twice = refusal(
        validator, tools=[WEATHER], tool_choice="required", response_format={"type": "json_object"}
    )
    assert forced_twice.param == "tool_choice"
    bad_parameters = {"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}
    assert refusal(validator, tools=[bad_parameters]).param == "tools.0.function.parameters"
    no_parser = JobValidator(
        renderer, model_name="tiny", default_max_tokens=64, max_n=1, max_tokens_cap=64
    )
    with pytest.raises(InvalidRequest, match="INFERQ_TOOL_CALL_PARSER"):
        spec(no_parser, tools=[WEATHER])


def test_a_conversation_with_earlier_calls_and_their_answers_renders(
    validator: JobValidator,
) -> None:
    messages = [
        ChatMessage(role="user", content="Weather in Paris?"),
        ChatMessage.model_validate(
            {
                "role": "assistant",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            }
        ),
        ChatMessage(role="tool", content="sunny", tool_call_id="call_1"),
    ]
    job = validator.spec(
        model=None,
        prompt=None,
        messages=messages,
        sampling=SamplingFields.model_validate({"tools": [WEATHER]}),
        metadata={},
    )
    assert job.messages is not None
    assert job.messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    with pytest.raises(ValueError, match="content is required"):
        ChatMessage.model_validate({"role": "user"})


def result(*texts: str, finish_reason: str = "stop") -> JobResult:
    return JobResult(
        choices=tuple(
            Choice(index=i, text=t, finish_reason=finish_reason, completion_tokens=5)
            for i, t in enumerate(texts)
        ),
        prompt_tokens=3,
    )


def test_forced_calls_are_read_as_json_and_a_cut_output_stays_text() -> None:
    named = with_tool_calls(
        result('{"city": "Paris"}', '{"city": "Par'),
        {"type": "function", "name": "get_weather"},
        None,
    )
    whole, cut = named.choices
    assert whole.finish_reason == "tool_calls"
    assert whole.text == ""
    assert whole.tool_calls is not None
    assert [(c.name, json.loads(c.arguments)) for c in whole.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert cut.tool_calls is None
    assert cut.text == '{"city": "Par'

    required = with_tool_calls(
        result(
            '[{"name": "get_time", "parameters": {}}, {"name": "get_weather", '
            '"parameters": {"city": "Oslo"}}]'
        ),
        {"type": "required"},
        None,
    )
    calls = required.choices[0].tool_calls
    assert calls is not None
    assert [c.name for c in calls] == ["get_time", "get_weather"]
    assert len({c.id for c in calls}) == 2
    assert Choice.from_dict(required.choices[0].to_dict()) == required.choices[0]


# Importing vLLM here (the test process) brings torch's own deprecation warnings.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_auto_calls_are_read_by_vllms_parser_for_the_model_family(tiny_model: Path) -> None:
    from worker.engine.vllm.tools import AutoToolParser

    class _Llm:
        def get_tokenizer(self) -> Any:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(tiny_model))

    parser = AutoToolParser("llama3_json", _Llm())  # type: ignore[arg-type]
    called = with_tool_calls(
        result('{"name": "get_weather", "parameters": {"city": "Paris"}}', "Just words."),
        {"type": "auto"},
        parser.parse,
    )
    call, words = called.choices
    assert call.tool_calls is not None
    assert [(c.name, json.loads(c.arguments)) for c in call.tool_calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert call.finish_reason == "tool_calls"
    assert words.tool_calls is None
    assert words.text == "Just words."
    # A parser that does not fit the model leaves outputs as text instead of failing.
    unfit = AutoToolParser("no-such-parser", _Llm())  # type: ignore[arg-type]
    assert unfit.parse('{"name": "x", "parameters": {}}') == ('{"name": "x", "parameters": {}}', [])


def test_text_that_is_not_unicode_or_too_deep_a_schema_is_refused(
    validator: JobValidator,
) -> None:
    lone = refusal(validator, structured_outputs={"json": {"enum": ["yes", "n\ud800o"]}})
    assert lone.param == "structured_outputs"
    assert "surrogate" in lone.message
    deep: dict[str, Any] = {"type": "object"}
    for _ in range(2000):
        deep = {"type": "array", "items": deep}
    too_deep = refusal(validator, structured_outputs={"json": deep})
    assert too_deep.param == "structured_outputs.json"
    assert "nested too deeply" in too_deep.message
    call = {"id": "c\ud800", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with pytest.raises(InvalidRequest) as caught:
        validator.spec(
            model=None,
            prompt=None,
            messages=[
                *CHAT,
                ChatMessage.model_validate({"role": "assistant", "tool_calls": [call]}),
            ],
            sampling=SamplingFields(),
            metadata={},
        )
    assert caught.value.param == "messages.1"


def test_a_job_shows_its_calls_in_openai_s_shape() -> None:
    called = with_tool_calls(
        result('{"city": "Paris"}'), {"type": "function", "name": "get_weather"}, None
    )
    [choice] = ChoicePublic.from_choice(called.choices[0]).model_dump(mode="json")["tool_calls"]
    assert choice["type"] == "function"
    assert choice["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert choice["id"]
