"""vLLM's `prompt_logprobs` through the real stack and the official `openai` client: the
prompt's logprobs come back where `vllm serve` puts them (on a chat completion, on each
choice of a text completion), in a job's result and in a batch's output lines; a request
that does not ask gets none; a stream that asks is a 422 naming the field."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import openai
import pytest

from inferq.wire.prompts import PromptRenderer
from tests.conftest import MODEL_NAME, Stack
from tests.integration.api.test_batches import read_lines, upload, wait_for
from tests.integration.api.test_online import client_for, job_id_of, wait_job

pytestmark = pytest.mark.engine

CHAT = [{"role": "user", "content": "Tell me about the sea."}]
TOKEN_IDS = [1, 70, 80, 90, 100]  # a prompt given as ids of the tiny model's vocabulary
GREEDY: dict[str, Any] = {"model": MODEL_NAME, "temperature": 0, "max_tokens": 3}


def assert_prompt_logprobs(positions: Any, prompt: Sequence[int], *, top: int) -> None:
    """vLLM's shape: None for the first token, then at each position the prompt's own token
    and up to `top` of the most likely, by id (as text)."""
    assert isinstance(positions, list)
    assert len(positions) == len(prompt)
    assert positions[0] is None
    for token_id, tokens in zip(prompt[1:], positions[1:], strict=True):
        assert str(token_id) in tokens
        assert 1 <= len(tokens) <= top + 1
        ranked = [t for t in tokens.values() if t["rank"] <= top]
        assert len(ranked) == top
        for token in tokens.values():
            assert isinstance(token["logprob"], float)
            assert token["logprob"] <= 0
            assert isinstance(token["rank"], int)
            assert token["rank"] >= 1
            assert isinstance(token["decoded_token"], str)


def test_a_chat_gets_the_prompts_logprobs_on_the_response(
    stack: Stack, renderer: PromptRenderer
) -> None:
    client = client_for(stack)
    completion = client.chat.completions.create(
        **GREEDY,
        messages=CHAT,  # type: ignore[arg-type]
        extra_body={"prompt_logprobs": 2},
    )
    assert completion.usage is not None
    [prompt] = renderer.encode_many([renderer.chat_text(CHAT)], add_special_tokens=False)
    assert len(prompt) == completion.usage.prompt_tokens
    positions = (completion.model_extra or {})["prompt_logprobs"]
    assert_prompt_logprobs(positions, prompt, top=2)
    assert "prompt_logprobs" not in (completion.choices[0].model_extra or {})

    # The job keeps them with its result.
    job = wait_job(stack, job_id_of(completion.id), "succeeded")
    assert job["params"]["prompt_logprobs"] == 2
    assert job["choices"][0]["prompt_logprobs"] == positions


def test_a_completion_gets_the_prompts_logprobs_on_each_choice(stack: Stack) -> None:
    client = client_for(stack)
    completion = client.completions.create(
        **{**GREEDY, "temperature": 1},
        prompt=TOKEN_IDS,
        n=2,
        extra_body={"prompt_logprobs": 2},
    )
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == len(TOKEN_IDS)
    first, second = (choice.model_extra or {} for choice in completion.choices)
    assert_prompt_logprobs(first["prompt_logprobs"], TOKEN_IDS, top=2)
    assert second["prompt_logprobs"] == first["prompt_logprobs"]
    assert "prompt_logprobs" not in (completion.model_extra or {})
    # 0: the prompt's own tokens alone.
    own = client.completions.create(**GREEDY, prompt=TOKEN_IDS, extra_body={"prompt_logprobs": 0})
    positions = (own.choices[0].model_extra or {})["prompt_logprobs"]
    assert [None if p is None else list(p) for p in positions] == [
        None,
        *([str(t)] for t in TOKEN_IDS[1:]),
    ]


def test_a_request_that_does_not_ask_gets_no_prompt_logprobs(stack: Stack) -> None:
    client = client_for(stack)
    chat = client.chat.completions.create(**GREEDY, messages=CHAT)  # type: ignore[arg-type]
    text = client.completions.create(**GREEDY, prompt=TOKEN_IDS)
    assert "prompt_logprobs" not in (chat.model_extra or {})
    assert "prompt_logprobs" not in (text.model_extra or {})
    assert "prompt_logprobs" not in (text.choices[0].model_extra or {})
    job = wait_job(stack, job_id_of(chat.id), "succeeded")
    assert "prompt_logprobs" not in job["choices"][0]
    assert "prompt_logprobs" not in job["params"]


def test_a_stream_that_asks_for_the_prompts_logprobs_is_a_422_naming_the_field(
    stack: Stack,
) -> None:
    client = client_for(stack)
    with pytest.raises(openai.UnprocessableEntityError) as caught:
        client.chat.completions.create(
            **GREEDY,
            messages=CHAT,  # type: ignore[arg-type]
            stream=True,
            extra_body={"prompt_logprobs": 1},
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "prompt_logprobs"
    assert "streaming" in error["message"]
    # 0, which serve takes in a stream, is answered; the job keeps the prompt's own tokens'.
    chunks = list(
        client.completions.create(
            **GREEDY, prompt=TOKEN_IDS, stream=True, extra_body={"prompt_logprobs": 0}
        )
    )
    job = wait_job(stack, job_id_of(chunks[0].id), "succeeded")
    assert_prompt_logprobs(job["choices"][0]["prompt_logprobs"], TOKEN_IDS, top=0)


def test_a_batchs_output_lines_carry_the_prompts_logprobs(stack: Stack) -> None:
    client = client_for(stack)
    lines = [
        {
            "custom_id": "c0",
            "method": "POST",
            "url": "/v1/completions",
            "body": {**GREEDY, "prompt": TOKEN_IDS, "prompt_logprobs": 1},
        }
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/completions", completion_window="24h"
    )
    batch = wait_for(client, batch.id)
    [line] = read_lines(client, batch.output_file_id)
    [choice] = line["response"]["body"]["choices"]
    assert_prompt_logprobs(choice["prompt_logprobs"], TOKEN_IDS, top=1)
