"""vLLM's `prompt_logprobs`: taken by every request shape that generates, in vLLM's range,
refused with `stream` as vLLM's server refuses it, carried to the engine's sampling
parameters, stored with the result and sent in serve's shapes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from api.schemas import JobCreate
from inferq.domain.jobs import Choice, SamplingParams
from inferq.domain.logprobs import PromptLogprob
from inferq.wire.batch_lines import BatchLineReader, LineSpec
from inferq.wire.model_catalog import FixedModels, ModelCatalog
from inferq.wire.openai_bodies import ChatBody, CompletionBody, prepare_body, prepare_prompts
from inferq.wire.openai_format import completion_body
from inferq.wire.prompts import PromptRenderer
from inferq.wire.public import ChoicePublic
from inferq.wire.validation import JobValidator
from tests.unit.inferq.test_embeddings import LIMITS, served

CHAT = [{"role": "user", "content": "hi"}]
Shape = type[ChatBody] | type[CompletionBody] | type[JobCreate]
SHAPES: list[tuple[Shape, dict[str, Any]]] = [
    (ChatBody, {"model": "tiny", "messages": CHAT}),
    (CompletionBody, {"model": "tiny", "prompt": "the sea"}),
    (JobCreate, {"prompt": "the sea"}),
]
# Three prompt positions: none before the first, then the prompt's token and the most likely.
POSITIONS = (
    None,
    {
        70: PromptLogprob(logprob=-2.5, rank=3, decoded_token=" sea"),
        12: PromptLogprob(logprob=-0.25, rank=1, decoded_token=" the"),
    },
    {80: PromptLogprob(logprob=-9999.0, rank=None, decoded_token=None)},
)


@pytest.fixture
def validator(renderer: PromptRenderer) -> JobValidator:
    return JobValidator(
        renderer, model_name="tiny", default_max_tokens=16, max_n=4, max_tokens_cap=2048
    )


@pytest.mark.parametrize(("model", "body"), SHAPES)
@pytest.mark.parametrize("value", [0, 2, 20])
def test_every_shape_takes_prompt_logprobs_from_0_to_20(
    model: Shape, body: dict[str, Any], value: int
) -> None:
    assert model.model_validate({**body, "prompt_logprobs": value}).prompt_logprobs == value


@pytest.mark.parametrize(("model", "body"), SHAPES)
@pytest.mark.parametrize("value", [-1, 21, "all"])
def test_prompt_logprobs_outside_the_range_is_refused_naming_the_field(
    model: Shape, body: dict[str, Any], value: object
) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate({**body, "prompt_logprobs": value})
    assert [e["loc"] for e in caught.value.errors()] == [("prompt_logprobs",)]


@pytest.mark.parametrize(("model", "body"), SHAPES)
def test_a_stream_refuses_prompt_logprobs_above_0_naming_the_field(
    model: Shape, body: dict[str, Any]
) -> None:
    with pytest.raises(ValidationError) as caught:
        model.model_validate({**body, "stream": True, "prompt_logprobs": 1})
    [error] = caught.value.errors()
    assert error["loc"] == ("prompt_logprobs",)
    assert "not returned when streaming" in error["msg"]
    # 0 asks for the prompt's own tokens only, which vLLM's server takes in a stream.
    assert model.model_validate({**body, "stream": True, "prompt_logprobs": 0}).stream


def test_prompt_logprobs_reach_the_jobs_sampling_parameters(validator: JobValidator) -> None:
    chat = ChatBody.model_validate({"model": "tiny", "messages": CHAT, "prompt_logprobs": 2})
    prepared = prepare_body(validator, chat)
    sampling = validator.finish(prepared, validator.encode([prepared])[0]).sampling
    assert sampling.prompt_logprobs == 2
    text = CompletionBody.model_validate({"model": "tiny", "prompt": "a", "prompt_logprobs": 0})
    [prepared] = prepare_prompts(validator, text)
    assert validator.finish(prepared, validator.encode([prepared])[0]).sampling.prompt_logprobs == 0
    # Stored only when asked for, and read back as it was.
    assert "prompt_logprobs" not in SamplingParams(max_tokens=8).to_dict()
    stored = json.loads(json.dumps(sampling.to_dict()))
    assert SamplingParams.from_dict(stored) == sampling


def test_a_batch_line_takes_prompt_logprobs(renderer: PromptRenderer) -> None:
    models = ModelCatalog(
        FixedModels([served(runner="generate")]), limits=LIMITS, load=lambda _info: renderer
    )
    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "writer", "messages": CHAT, "prompt_logprobs": 3},
    }
    reader = BatchLineReader(models, endpoint="/v1/chat/completions")
    [spec] = reader.read([json.dumps(line).encode()])
    assert isinstance(spec, LineSpec)
    assert spec.spec.sampling.prompt_logprobs == 3


def test_a_choices_prompt_logprobs_round_trip_through_stored_json() -> None:
    choice = Choice(
        index=0, text="x", finish_reason="stop", completion_tokens=1, prompt_logprobs=POSITIONS
    )
    stored = json.loads(json.dumps(choice.to_dict()))
    assert stored["prompt_logprobs"] == [
        None,
        {
            "70": {"logprob": -2.5, "rank": 3, "decoded_token": " sea"},
            "12": {"logprob": -0.25, "rank": 1, "decoded_token": " the"},
        },
        {"80": {"logprob": -9999.0, "rank": None, "decoded_token": None}},
    ]
    assert Choice.from_dict(stored) == choice
    # Not asked for: the stored choice is as it always was.
    plain = Choice(index=0, text="x", finish_reason="stop", completion_tokens=1)
    assert "prompt_logprobs" not in plain.to_dict()
    assert Choice.from_dict(plain.to_dict()).prompt_logprobs is None


def _bodies(*, with_logprobs: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    choices = [
        Choice(
            index=i,
            text="x",
            finish_reason="stop",
            completion_tokens=1,
            prompt_logprobs=POSITIONS if with_logprobs else None,
        ).to_dict()
        for i in range(2)
    ]
    common: dict[str, Any] = {
        "job_id": "job_1",
        "created": 0,
        "model": "tiny",
        "choices": choices,
        "prompt_tokens": 3,
        "completion_tokens": 2,
    }
    return completion_body(chat=True, **common), completion_body(chat=False, **common)


def test_responses_carry_the_prompt_logprobs_where_vllms_server_puts_them() -> None:
    chat, text = _bodies(with_logprobs=True)
    # A chat completion's are on the response; a text completion's on each choice.
    assert chat["prompt_logprobs"][0] is None
    assert chat["prompt_logprobs"][1]["70"] == {"logprob": -2.5, "rank": 3, "decoded_token": " sea"}
    assert all("prompt_logprobs" not in c for c in chat["choices"])
    assert [c["prompt_logprobs"] for c in text["choices"]] == [chat["prompt_logprobs"]] * 2
    assert "prompt_logprobs" not in text


def test_responses_without_prompt_logprobs_have_no_such_field() -> None:
    chat, text = _bodies(with_logprobs=False)
    assert "prompt_logprobs" not in chat
    assert all("prompt_logprobs" not in c for c in [*chat["choices"], *text["choices"]])


def test_a_jobs_choices_show_the_prompt_logprobs_only_when_asked() -> None:
    asked = Choice(
        index=0, text="x", finish_reason="stop", completion_tokens=1, prompt_logprobs=POSITIONS
    )
    shown = ChoicePublic.from_choice(asked).model_dump(mode="json")
    assert shown["prompt_logprobs"] == asked.to_dict()["prompt_logprobs"]
    plain = Choice(index=0, text="x", finish_reason="stop", completion_tokens=1)
    assert "prompt_logprobs" not in ChoicePublic.from_choice(plain).model_dump(mode="json")
