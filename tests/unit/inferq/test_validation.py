"""Request validation with the tiny model's real tokenizer and chat template."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from inferq.exceptions import InvalidRequest
from inferq.wire.messages import ChatMessage
from inferq.wire.prompts import PromptRenderer
from inferq.wire.sampling_fields import SamplingFields
from inferq.wire.validation import JobValidator


@pytest.fixture
def validator(renderer: PromptRenderer) -> JobValidator:
    return JobValidator(
        renderer, model_name="tiny", default_max_tokens=256, max_n=4, max_tokens_cap=2048
    )


def _spec(validator: JobValidator, **kwargs: object):  # type: ignore[no-untyped-def]
    sampling = SamplingFields.model_validate(kwargs.pop("sampling", {}))
    return validator.spec(
        model=kwargs.get("model"),  # type: ignore[arg-type]
        prompt=kwargs.get("prompt"),  # type: ignore[arg-type]
        messages=kwargs.get("messages"),  # type: ignore[arg-type]
        sampling=sampling,
        metadata={},
    )


def test_a_prompt_is_tokenized_with_bos(validator: JobValidator, renderer: PromptRenderer) -> None:
    spec = _spec(validator, prompt="Hello world")
    assert spec.prompt_token_ids[0] == 0  # <|begin_of_text|>
    assert [spec.prompt_token_ids] == renderer.encode_many(["Hello world"], add_special_tokens=True)
    assert spec.sampling.max_tokens == 256


def test_messages_are_rendered_with_the_chat_template(validator: JobValidator) -> None:
    spec = _spec(
        validator,
        messages=[
            ChatMessage(role="system", content="be brief"),
            ChatMessage(role="user", content=[{"type": "text", "text": "hi"}]),  # type: ignore[list-item]
        ],
    )
    assert spec.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert len(spec.prompt_token_ids) > 10


def test_prompt_plus_max_tokens_over_the_context_names_the_limit(validator: JobValidator) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _spec(validator, prompt="Hello world", sampling={"max_tokens": 1023})
    assert caught.value.param == "max_tokens"
    assert "context of 1024 tokens" in caught.value.message
    assert "at most 1021" in caught.value.message


def test_a_prompt_longer_than_the_context_is_refused(validator: JobValidator) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _spec(validator, prompt="Hello world " * 2000)
    assert caught.value.param == "prompt"
    assert caught.value.code == "context_length_exceeded"


def test_default_max_tokens_shrinks_to_the_room_left(renderer: PromptRenderer) -> None:
    validator = JobValidator(
        renderer, model_name="tiny", default_max_tokens=5000, max_n=4, max_tokens_cap=9000
    )
    spec = _spec(validator, prompt="Hello world")
    assert spec.sampling.max_tokens == 1024 - len(spec.prompt_token_ids)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"model": "gpt-4"}, "model"),
        ({"prompt": "a", "messages": [ChatMessage(role="user", content="b")]}, "prompt"),
        ({}, "prompt"),
        ({"messages": []}, "messages"),
        ({"prompt": "a", "sampling": {"n": 5}}, "n"),
    ],
)
def test_invalid_combinations_name_the_field(
    validator: JobValidator, kwargs: dict[str, object], param: str
) -> None:
    kwargs.setdefault("prompt", None)
    with pytest.raises(InvalidRequest) as caught:
        _spec(validator, **kwargs)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 2.5),
        ("top_p", 0),
        ("max_tokens", 0),
        ("logprobs", 21),
        ("presence_penalty", -3),
        ("repetition_penalty", 0),
        ("stop", [""]),
        ("stop", ["x"] * 17),
        ("seed", -1),
        ("bogus", 1),
    ],
)
def test_out_of_range_sampling_fields_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError) as caught:
        SamplingFields.model_validate({field: value})
    assert caught.value.errors()[0]["loc"][0] == field
