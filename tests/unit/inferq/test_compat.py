"""What a client written for OpenAI or `vllm serve` may send: fields that mean nothing here
are accepted and logged once, fields that change the output reach the job's sampling
parameters, and values that cannot be honoured are refused naming the field."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from inferq.domain.jobs import Choice, JobResult, JobSpec, SamplingParams
from inferq.exceptions import InvalidRequest
from inferq.wire import compat
from inferq.wire.batch_lines import BatchLineReader, LineSpec
from inferq.wire.model_catalog import FixedModels, ModelCatalog
from inferq.wire.openai_bodies import ChatBody, CompletionBody, prepare_body, prepare_prompts
from inferq.wire.prompts import PromptRenderer
from inferq.wire.validation import JobValidator
from tests.unit.inferq.test_embeddings import LIMITS, served
from worker.engine.tool_calls import with_tool_calls

CHAT = [{"role": "user", "content": "hi"}]
TOOLS = [
    {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "b", "parameters": {"type": "object"}}},
]


@pytest.fixture
def validator(renderer: PromptRenderer) -> JobValidator:
    return JobValidator(
        renderer, model_name="tiny", default_max_tokens=16, max_n=4, max_tokens_cap=2048
    )


@pytest.fixture
def fresh_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each ignored name is logged once per process: forget those logged so far."""
    monkeypatch.setattr(compat, "_logged", set())


def _ignored_names(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.ignored_field for r in caplog.records if hasattr(r, "ignored_field")]


def _finished(validator: JobValidator, body: ChatBody) -> JobSpec:
    prepared = prepare_body(validator, body)
    return validator.finish(prepared, validator.encode([prepared])[0])


@pytest.mark.usefixtures("fresh_log")
def test_unknown_and_meaningless_fields_are_accepted_and_each_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "hi", "refusal": None}],
        "store": True,
        "metadata": {"team": "x"},
        "reasoning_effort": "low",
        "modalities": ["text"],
        "user": "u1",
        "vendor_extra": {"anything": 1},
    }
    with caplog.at_level(logging.WARNING, logger="inferq.wire.compat"):
        ChatBody.model_validate(body)
        ChatBody.model_validate(body)
    assert sorted(_ignored_names(caplog)) == [
        "metadata",
        "refusal",
        "store",
        "user",
        "vendor_extra",
    ]
    [line] = [r.getMessage() for r in caplog.records if r.ignored_field == "vendor_extra"]  # type: ignore[attr-defined]
    assert line == (
        "request field 'vendor_extra' is accepted and ignored: it has no effect here (logged once)"
    )


def test_fields_that_change_the_output_reach_the_sampling_parameters(
    validator: JobValidator,
) -> None:
    body = ChatBody.model_validate(
        {
            "model": "tiny",
            "messages": CHAT,
            "logit_bias": {"17": -100, "5": 3.5},
            "min_tokens": 4,
            "skip_special_tokens": False,
            "spaces_between_special_tokens": False,
            "include_stop_str_in_output": True,
            "stop_token_ids": [2],
            "allowed_token_ids": [5, 17, 30],
            "bad_words": ["sea"],
        }
    )
    sampling = _finished(validator, body).sampling
    assert sampling.logit_bias == {17: -100, 5: 3.5}
    assert sampling.min_tokens == 4
    assert sampling.skip_special_tokens is False
    assert sampling.spaces_between_special_tokens is False
    assert sampling.include_stop_str_in_output is True
    assert sampling.stop_token_ids == (2,)
    assert sampling.allowed_token_ids == (5, 17, 30)
    assert sampling.bad_words == ("sea",)
    # Stored and read back as they were (JSON keys are text).
    stored = json.loads(json.dumps(sampling.to_dict()))
    assert SamplingParams.from_dict(stored) == sampling


def test_a_job_stores_only_the_sampling_fields_it_set() -> None:
    stored = SamplingParams(max_tokens=8).to_dict()
    assert "logit_bias" not in stored
    assert "min_tokens" not in stored
    assert SamplingParams.from_dict(stored) == SamplingParams(max_tokens=8)


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"logit_bias": {"999999": 1}}, "logit_bias", "outside this model's vocabulary"),
        ({"logit_bias": {"sea": 1}}, "logit_bias", "keys are token ids"),
        ({"allowed_token_ids": [-1]}, "allowed_token_ids", "outside this model's vocabulary"),
        ({"min_tokens": 40, "max_tokens": 8}, "min_tokens", "over max_tokens (8)"),
        ({"n": 2, "temperature": 0}, "n", "temperature 0 (greedy) has one answer"),
    ],
)
def test_values_outside_the_model_are_refused_naming_the_field(
    validator: JobValidator, extra: dict[str, Any], param: str, message: str
) -> None:
    body = ChatBody.model_validate({"model": "tiny", "messages": CHAT, **extra})
    with pytest.raises(InvalidRequest) as caught:
        _finished(validator, body)
    assert caught.value.param == param
    assert message in caught.value.message


@pytest.mark.parametrize(
    ("body", "where", "message"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            ("messages", 0, "content", "list", 0),
            "only text parts are supported",
        ),
        ({"messages": CHAT, "modalities": ["text", "audio"]}, ("modalities",), "text only"),
    ],
)
def test_what_a_text_model_cannot_do_is_refused_naming_the_field(
    body: dict[str, Any], where: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatBody.model_validate({"model": "tiny", **body})
    [error] = caught.value.errors()
    assert error["loc"] == where
    assert message in error["msg"]


def test_a_completion_takes_a_list_of_prompts_text_or_token_ids(
    validator: JobValidator, renderer: PromptRenderer
) -> None:
    [ids] = renderer.encode_many(["the sea"], add_special_tokens=False)
    body = CompletionBody.model_validate({"model": "tiny", "prompt": ["a cat", ids], "echo": True})
    first, second = prepare_prompts(validator, body)
    encoded = validator.encode([first, second])
    assert encoded[1] == ids  # token ids go to the engine as given
    assert validator.finish(second, encoded[1]).prompt == "the sea"
    assert validator.finish(first, encoded[0]).sampling.echo is True
    # One prompt of token ids is one prompt, not a list of them.
    body = CompletionBody.model_validate({"model": "tiny", "prompt": ids})
    assert len(prepare_prompts(validator, body)) == 1


def test_a_batch_line_of_several_prompts_is_refused_naming_the_prompt(
    validator: JobValidator,
) -> None:
    body = CompletionBody.model_validate({"model": "tiny", "prompt": ["a", "b"]})
    with pytest.raises(InvalidRequest) as caught:
        prepare_body(validator, body)
    assert caught.value.param == "prompt"
    assert "one per batch line" in caught.value.message


def test_echo_with_logprobs_and_a_suffix_are_refused() -> None:
    with pytest.raises(ValidationError, match="echo with logprobs"):
        CompletionBody.model_validate({"model": "t", "prompt": "a", "echo": True, "logprobs": 1})
    with pytest.raises(ValidationError, match="suffix is not supported"):
        CompletionBody.model_validate({"model": "t", "prompt": "a", "suffix": "b"})


def test_without_parallel_tool_calls_a_forced_call_is_one_and_a_parsed_one_is_cut_to_one(
    validator: JobValidator,
) -> None:
    body = ChatBody.model_validate(
        {
            "model": "tiny",
            "messages": CHAT,
            "tools": TOOLS,
            "tool_choice": "required",
            "parallel_tool_calls": False,
        }
    )
    output = prepare_body(validator, body).output
    assert output.structured is not None
    assert output.structured["json"]["maxItems"] == 1
    assert output.tool_choice == {"type": "required", "parallel": False}

    two_calls = '[{"name": "a", "parameters": {}}, {"name": "b", "parameters": {}}]'
    result = JobResult(
        choices=(Choice(index=0, text=two_calls, finish_reason="stop", completion_tokens=9),),
        prompt_tokens=3,
    )
    [parallel] = with_tool_calls(result, {"type": "required"}, None).choices
    [single] = with_tool_calls(result, output.tool_choice, None).choices
    assert [c.name for c in parallel.tool_calls or ()] == ["a", "b"]
    assert [c.name for c in single.tool_calls or ()] == ["a"]


@pytest.mark.usefixtures("fresh_log")
def test_a_batch_line_ignores_unknown_fields_too(
    caplog: pytest.LogCaptureFixture, renderer: PromptRenderer
) -> None:
    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "writer", "messages": CHAT, "store": False, "x_vendor": 1},
    }
    models = ModelCatalog(
        FixedModels([served(runner="generate")]), limits=LIMITS, load=lambda _info: renderer
    )
    reader = BatchLineReader(models, endpoint="/v1/chat/completions")
    with caplog.at_level(logging.WARNING, logger="inferq.wire.compat"):
        [spec] = reader.read([json.dumps(line).encode()])
    assert isinstance(spec, LineSpec)
    assert spec.custom_id == "r1"
    assert sorted(_ignored_names(caplog)) == ["store", "x_vendor"]


def test_a_batch_line_runs_as_batch_work_whatever_tier_it_names(renderer: PromptRenderer) -> None:
    models = ModelCatalog(
        FixedModels([served(runner="generate")]), limits=LIMITS, load=lambda _info: renderer
    )
    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/responses",
        "body": {"model": "writer", "input": "hi", "service_tier": "priority"},
    }
    [spec] = BatchLineReader(models, endpoint="/v1/responses").read([json.dumps(line).encode()])
    assert isinstance(spec, LineSpec)
    assert spec.spec.response is not None
    assert spec.spec.response["service_tier"] == "default"


def test_a_prompt_is_truncated_to_its_last_tokens_when_asked(validator: JobValidator) -> None:
    body = CompletionBody.model_validate(
        {"model": "tiny", "prompt": "the sea and the sky", "truncate_prompt_tokens": 3}
    )
    [whole] = prepare_prompts(validator, body)
    ids = validator.encode([whole])[0]
    assert list(validator.finish(whole, ids).prompt_token_ids) == ids[-3:]


def test_beam_search_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError) as caught:
        ChatBody.model_validate({"model": "tiny", "messages": CHAT, "use_beam_search": True})
    [error] = caught.value.errors()
    assert error["loc"] == ("use_beam_search",)
    assert "beam search" in error["msg"]


def test_the_chat_template_takes_vllms_options(validator: JobValidator) -> None:
    def text(**options: Any) -> str:
        body = ChatBody.model_validate(
            {
                "model": "tiny",
                "messages": [*CHAT, {"role": "assistant", "content": "Once upon"}],
                **options,
            }
        )
        return prepare_body(validator, body).text

    opened = text()
    continued = text(add_generation_prompt=False, continue_final_message=True)
    assert continued.endswith("Once upon")
    assert not opened.endswith("Once upon")
    assert opened.startswith(continued.removesuffix("Once upon"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"continue_final_message": True}, "needs add_generation_prompt false"),
        ({"chat_template_kwargs": {"tokenize": True}}, "tokenize cannot be set here"),
    ],
)
def test_chat_template_options_that_clash_are_refused(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        ChatBody.model_validate({"model": "tiny", "messages": CHAT, **options})


def test_messages_the_chat_template_refuses_are_an_invalid_request(tiny_model: Path) -> None:
    renderer = PromptRenderer.load(str(tiny_model), max_model_len=None)
    renderer.use_chat_template(
        "{% if messages[0].role != 'system' %}"
        "{{ raise_exception('the first message must be the system prompt') }}{% endif %}"
    )
    with pytest.raises(InvalidRequest) as caught:
        renderer.chat_text(CHAT)
    assert caught.value.param == "messages"
    assert "the first message must be the system prompt" in caught.value.message


def test_reasoning_effort_reaches_a_chat_template_that_reads_it(tiny_model: Path) -> None:
    renderer = PromptRenderer.load(str(tiny_model), max_model_len=None)
    renderer.use_chat_template("effort={{ reasoning_effort | default('none') }}")
    validator = JobValidator(
        renderer, model_name="tiny", default_max_tokens=16, max_n=4, max_tokens_cap=2048
    )

    def text(**asked: Any) -> str:
        body = ChatBody.model_validate({"model": "tiny", "messages": CHAT, **asked})
        return prepare_body(validator, body).text

    assert text(reasoning_effort="low") == "effort=low"
    assert text() == "effort=none"
