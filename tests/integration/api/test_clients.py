"""Client libraries built on OpenAI's API, unchanged, against the real stack: LangChain's
`ChatOpenAI` plain, streamed, batched, with a forced tool call made once, and with
structured output parsed into a pydantic model; pydantic-ai's agent with its model
settings (`parallel_tool_calls`, `logit_bias`) and a structured output; the OpenAI Agents
SDK's agent on its chat-completions model and on its responses model, to a plain, a
structured and a function tool's final output; instructor's structured extraction in its
tools and JSON-schema modes."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import httpx
import instructor
import pytest
from agents import Agent as AgentsAgent
from agents import ModelSettings as AgentsSettings
from agents import (
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests.conftest import ADMIN_KEY, MODEL_NAME, Stack

pytestmark = pytest.mark.engine

QUESTION = "Tell me about the sea."


class Sentiment(BaseModel):
    """How a text feels."""

    label: Literal["positive", "negative", "neutral"]
    score: int = Field(ge=0, le=10)


class Weather(BaseModel):
    """The forecast for a city."""

    city: Literal["Paris", "Oslo", "Lima"]
    days: int = Field(ge=1, le=7)


@contextmanager
def chat_model(stack: Stack, **kwargs: object) -> Iterator[ChatOpenAI]:
    """LangChain's chat model on the stack, over an HTTP client closed when done with."""
    with httpx.Client(timeout=120) as http:
        yield ChatOpenAI(
            model=MODEL_NAME,
            base_url=stack.url + "/v1",
            api_key=ADMIN_KEY,  # type: ignore[arg-type]
            max_retries=0,
            http_client=http,
            **{"temperature": 0, **kwargs},  # type: ignore[arg-type]
        )


def test_langchain_invokes_streams_and_batches(stack: Stack) -> None:
    with chat_model(stack, max_tokens=8, logit_bias={"4": -100}, stream_usage=True) as model:
        answer = model.invoke(QUESTION)
        streamed = "".join(str(chunk.content) for chunk in model.stream(QUESTION))
        batched = model.batch([QUESTION, "A cat sat"])
    assert isinstance(answer.content, str)
    assert answer.content
    assert streamed == answer.content  # greedy: the same text, streamed or not
    assert batched[0].content == answer.content
    assert len(batched) == 2
    assert answer.usage_metadata is not None
    assert answer.usage_metadata["output_tokens"] == 8  # end of sequence ruled out


def test_langchain_tools_without_parallel_calls_and_structured_output(stack: Stack) -> None:
    # Sampled, as the structured-output tests are: greedy JSON from the random tiny model
    # can run on in whitespace until max_tokens.
    with chat_model(stack, max_tokens=400, seed=2, temperature=1) as model:
        with_tools = model.bind_tools([Weather], tool_choice="Weather", parallel_tool_calls=False)
        message = with_tools.invoke("What is the weather in Oslo?")
        feeling = model.with_structured_output(Sentiment).invoke("I love the sea.")
    [call] = message.tool_calls  # type: ignore[attr-defined]
    assert call["name"] == "Weather"
    Weather.model_validate(call["args"])

    assert isinstance(feeling, Sentiment)


def test_pydantic_ai_runs_with_its_model_settings_and_a_structured_output(stack: Stack) -> None:
    settings = ModelSettings(
        max_tokens=8, temperature=0, parallel_tool_calls=False, logit_bias={"4": -100}
    )
    sampled = ModelSettings(max_tokens=400, seed=2, parallel_tool_calls=False)

    async def run() -> tuple[Any, Any]:
        # The agent's own OpenAI client, closed on its loop when done with.
        async with AsyncOpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY) as client:
            model = OpenAIChatModel(MODEL_NAME, provider=OpenAIProvider(openai_client=client))
            plain = await Agent(model, model_settings=settings).run(QUESTION)
            feeling = await Agent(model, output_type=Sentiment, model_settings=sampled).run(
                "I love it."
            )
        return plain, feeling

    plain, feeling = asyncio.run(run())
    assert isinstance(plain.output, str)
    assert plain.usage.output_tokens == 8  # end of sequence ruled out
    assert isinstance(feeling.output, Sentiment)


@function_tool
def forecast(city: Literal["Paris", "Oslo", "Lima"], days: int) -> str:
    """The forecast for a city, some days ahead."""
    return f"{city}: sunny for {days} days"


@pytest.mark.parametrize("model_class", [OpenAIChatCompletionsModel, OpenAIResponsesModel])
def test_openai_agents_run_to_a_final_output(
    stack: Stack, model_class: type[OpenAIChatCompletionsModel | OpenAIResponsesModel]
) -> None:
    # A response cut short by max_output_tokens is `incomplete`, which the SDK's responses
    # model raises on (as it does against OpenAI's): the plain answer ends at a stop string
    # (vLLM's `stop`), the structured and the tool call's arguments where their schema does.
    plain_settings = AgentsSettings(max_tokens=100, temperature=0, extra_body={"stop": "."})
    # Sampled, as the structured-output tests are (see the LangChain test above); the tool
    # is forced, and the agent stops on its result, since the random model's free text
    # would not choose to call it.
    sampled = AgentsSettings(max_tokens=400, temperature=1, extra_body={"seed": 2})
    forced = sampled.resolve(AgentsSettings(tool_choice="forecast", parallel_tool_calls=False))
    no_tracing = RunConfig(tracing_disabled=True)

    async def run() -> tuple[Any, Any, Any]:
        async with AsyncOpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY) as client:
            model = model_class(model=MODEL_NAME, openai_client=client)
            plain = await Runner.run(
                AgentsAgent(name="plain", model=model, model_settings=plain_settings),
                QUESTION,
                run_config=no_tracing,
            )
            feeling = await Runner.run(
                AgentsAgent(
                    name="feeling", model=model, model_settings=sampled, output_type=Sentiment
                ),
                "I love it.",
                run_config=no_tracing,
            )
            called = await Runner.run(
                AgentsAgent(
                    name="weather",
                    model=model,
                    model_settings=forced,
                    tools=[forecast],
                    tool_use_behavior="stop_on_first_tool",
                ),
                "What is the weather in Oslo?",
                run_config=no_tracing,
            )
        return plain, feeling, called

    plain, feeling, called = asyncio.run(run())
    assert isinstance(plain.final_output, str)
    assert plain.final_output
    assert "." not in plain.final_output
    assert isinstance(feeling.final_output, Sentiment)
    assert called.final_output.startswith(("Paris:", "Oslo:", "Lima:"))
    assert "sunny for" in called.final_output


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_instructor_extracts_a_validated_model(stack: Stack, mode: instructor.Mode) -> None:
    # Sampled, as the structured-output tests are (see the LangChain test above).
    with OpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY) as openai_client:
        client = instructor.from_openai(openai_client, mode=mode)
        weather, completion = client.chat.completions.create_with_completion(
            model=MODEL_NAME,
            response_model=Weather,
            messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
            max_tokens=400,
            temperature=1,
            seed=2,
            max_retries=0,
        )
    assert isinstance(weather, Weather)
    assert completion.model == MODEL_NAME
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
