"""What clients written for OpenAI or `vllm serve` send, through the official `openai`
client against the real stack: optional fields that mean nothing here are accepted, those
that change the output change it, and what a text model cannot do is a 422 naming the
field."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from inferq.store.models import ShareRow
from inferq.wire.prompts import PromptRenderer
from tests.conftest import MODEL_NAME, Stack
from tests.helpers.processes import log_contains
from tests.integration.api.test_online import client_for
from tests.integration.api.test_structured import MAX_TOKENS, TOOLS

pytestmark = pytest.mark.engine

CHAT = [{"role": "user", "content": "Tell me about the sea."}]
EOS = 4  # the tiny model's <|eot_id|>
GREEDY: dict[str, Any] = {"model": MODEL_NAME, "temperature": 0, "max_tokens": 6}


def test_a_chat_with_every_optional_field_is_answered_and_honours_those_that_matter(
    stack: Stack,
) -> None:
    client = client_for(stack)
    completion = client.chat.completions.create(
        **GREEDY,
        messages=CHAT,  # type: ignore[arg-type]
        store=True,
        metadata={"team": "search"},
        modalities=["text"],
        reasoning_effort="low",
        user="user-1",
        logit_bias={str(EOS): 100},  # end of sequence at once...
        extra_body={"min_tokens": 3, "x_vendor_hint": {"cache": True}},  # ...but not before 3
    )
    [choice] = completion.choices
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.completion_tokens >= 3
    # A field nobody declared is logged by name, once.
    assert log_contains(stack.api, "request field 'x_vendor_hint' is accepted and ignored")()

    stopped = client.chat.completions.create(
        **GREEDY,
        messages=CHAT,  # type: ignore[arg-type]
        logit_bias={str(EOS): 100},
    )
    assert stopped.usage is not None
    assert stopped.usage.completion_tokens == 1
    assert stopped.choices[0].message.content == ""


def test_special_tokens_are_in_the_text_only_when_asked(stack: Stack) -> None:
    client = client_for(stack)
    asked: dict[str, Any] = {
        **GREEDY,
        "max_tokens": 3,
        "prompt": "The sea",
        "logit_bias": {str(EOS): 100},
    }
    kept = client.completions.create(
        **asked, extra_body={"ignore_eos": True, "skip_special_tokens": False}
    )
    skipped = client.completions.create(**asked, extra_body={"ignore_eos": True})
    assert kept.choices[0].text == "<|eot_id|>" * 3
    assert skipped.choices[0].text == ""


def test_a_list_of_prompts_gets_one_choice_per_prompt_in_order(
    stack: Stack, renderer: PromptRenderer
) -> None:
    client = client_for(stack)
    prompts = ["The sea", "A cat sat"]
    alone = [client.completions.create(**GREEDY, prompt=p).choices[0].text for p in prompts]
    token_ids = renderer.encode_many(prompts, add_special_tokens=True)

    listed = client.completions.create(**GREEDY, prompt=prompts)
    as_ids = client.completions.create(**GREEDY, prompt=token_ids)
    one_as_ids = client.completions.create(**GREEDY, prompt=token_ids[1])
    sampled = client.completions.create(**{**GREEDY, "temperature": 1}, prompt=prompts, n=2)

    assert [c.text for c in listed.choices] == alone
    streamed = list(
        client.completions.create(
            **GREEDY, prompt=prompts, stream=True, stream_options={"include_usage": True}
        )
    )
    texts = ["", ""]
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert texts == alone
    assert len({chunk.id for chunk in streamed}) == 1
    assert streamed[-1].usage is not None
    assert listed.usage is not None
    assert streamed[-1].usage.completion_tokens == listed.usage.completion_tokens
    assert [c.index for c in listed.choices] == [0, 1]
    assert [c.index for c in sampled.choices] == [0, 1, 2, 3]
    assert [c.text for c in as_ids.choices] == alone
    assert [c.text for c in one_as_ids.choices] == [alone[1]]
    assert listed.usage is not None
    assert listed.usage.prompt_tokens == sum(len(ids) for ids in token_ids)


def test_echo_starts_the_text_with_the_prompt_streamed_or_not(stack: Stack) -> None:
    client = client_for(stack)
    plain = client.completions.create(**GREEDY, prompt="The sea")
    echoed = client.completions.create(**GREEDY, prompt="The sea", echo=True)
    streamed = client.completions.create(**GREEDY, prompt="The sea", echo=True, stream=True)
    assert echoed.choices[0].text == "The sea" + plain.choices[0].text
    assert "".join(c.choices[0].text for c in streamed if c.choices) == echoed.choices[0].text


def test_without_parallel_tool_calls_a_chat_makes_one_call(stack: Stack) -> None:
    client = client_for(stack)
    completion = client.chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT,  # type: ignore[arg-type]
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=MAX_TOKENS,
        seed=2,
    )
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    assert len(choice.message.tool_calls) == 1


@pytest.mark.parametrize(
    ("asked", "param", "message"),
    [
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}},
                        ],
                    }
                ]
            },
            "messages.0.content.1",
            "only text parts are supported",
        ),
        ({"messages": CHAT, "modalities": ["text", "audio"]}, "modalities", "text only"),
        ({"messages": CHAT, "logit_bias": {"100000": 5}}, "logit_bias", "vocabulary"),
    ],
)
def test_what_cannot_be_honoured_is_a_422_naming_the_field(
    stack: Stack, asked: dict[str, Any], param: str, message: str
) -> None:
    client = client_for(stack)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(**GREEDY, **asked)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert message in error["message"]


def test_the_answer_says_which_service_tier_ran(stack: Stack) -> None:
    client = client_for(stack)
    tiers = {
        tier: client.chat.completions.create(
            **GREEDY,
            messages=CHAT,  # type: ignore[arg-type]
            service_tier=tier,  # type: ignore[arg-type]
        )
        for tier in ("auto", "default", "flex", "priority")
    }
    assert {asked: c.service_tier for asked, c in tiers.items()} == {
        "auto": "default",
        "default": "default",
        "flex": "flex",
        "priority": "priority",
    }
    # Each ran: the tier orders the work, it does not change the output.
    assert len({c.choices[0].message.content for c in tiers.values()}) == 1
    streamed = client.completions.create(
        **GREEDY, prompt="The sea", stream=True, extra_body={"service_tier": "flex"}
    )
    assert {getattr(chunk, "service_tier", None) for chunk in streamed} == {"flex"}
    response = client.responses.create(
        model=MODEL_NAME, input="The sea", max_output_tokens=4, service_tier="priority"
    )
    assert response.service_tier == "priority"


def test_flex_work_counts_in_its_tenants_share_of_batch_work(stack: Stack) -> None:
    secret = stack.new_key()
    tenant = stack.tenant_of(secret)
    client = openai.OpenAI(base_url=stack.url + "/v1", api_key=secret, max_retries=0, timeout=120)

    def place() -> float:
        """Where the tenant's share of the model's batch work has got to."""
        with stack.store._transaction() as session:
            row = session.get(ShareRow, (f"bulk:{MODEL_NAME}", tenant))
            assert row is not None
            return row.finish

    def chat(tier: str) -> None:
        client.chat.completions.create(
            **GREEDY,
            messages=CHAT,  # type: ignore[arg-type]
            service_tier=tier,  # type: ignore[arg-type]
        )

    chat("flex")
    first = place()
    chat("default")
    assert place() == first  # a single job is not batch work
    chat("flex")
    assert place() == first + 1  # weight 1: one line's worth
    client.close()
