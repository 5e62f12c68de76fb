"""The request shapes `bench.compat` sends to `vllm serve` and to inferq: what clients
written for OpenAI or for serve put in a request, one field or one form at a time, on the
tiny model (greedy, a few tokens each). `ordinary` shapes are ones serve answers; the
others ask for what a text model cannot do, and both should refuse them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT = [{"role": "user", "content": "Tell me about the sea."}]
PROMPT = "The sea"
# Token ids of the tiny model's vocabulary (it has 512): a prompt given as ids.
TOKEN_IDS = [1, 70, 80, 90]
EOS = 4  # the tiny model's <|eot_id|>
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "description": "The forecast.", "parameters": WEATHER},
}
# A 1x1 PNG.
IMAGE = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQ"
    "GAhKmMIQAAAABJRU5ErkJggg=="
)


@dataclass(frozen=True)
class Shape:
    name: str
    path: str
    body: dict[str, Any]
    group: str
    ordinary: bool = True

    @property
    def streamed(self) -> bool:
        return bool(self.body.get("stream"))


def _chat(name: str, group: str, ordinary: bool = True, **fields: Any) -> Shape:
    body = {"messages": CHAT, "max_tokens": 6, "temperature": 0, **fields}
    return Shape(name, "/v1/chat/completions", body, group, ordinary)


def _text(name: str, group: str, **fields: Any) -> Shape:
    body = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, **fields}
    return Shape(name, "/v1/completions", body, group)


def _structured(max_tokens: int = 200, **fields: Any) -> dict[str, Any]:
    # Sampled: greedy JSON from the random model can run on in whitespace.
    return {"max_tokens": max_tokens, "temperature": 1, "seed": 2, **fields}


SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "weather", "schema": WEATHER}}
OPENAI, VLLM, VENDOR, PROMPTS, TEMPLATE, TOOLS, FORMAT, STREAM, RESPONSES, REFUSED = (
    "OpenAI's optional fields",
    "vLLM's extra fields",
    "another vendor's fields",
    "completions prompts",
    "chat template",
    "tools",
    "structured output",
    "streaming",
    "Responses API",
    "what a text model cannot do",
)

SHAPES: tuple[Shape, ...] = (
    _chat("chat", OPENAI),
    _chat("temperature-top_p", OPENAI, temperature=0.7, top_p=0.9, seed=1),
    _chat("logit_bias", OPENAI, logit_bias={str(EOS): -100}),
    _chat("logprobs", OPENAI, logprobs=True, top_logprobs=2),
    _chat("n", OPENAI, n=2, temperature=1, seed=1),
    _chat("stop", OPENAI, stop=["\n", "."]),
    _chat("penalties", OPENAI, presence_penalty=0.5, frequency_penalty=0.5),
    _chat("max_completion_tokens", OPENAI, max_completion_tokens=6),
    _chat("store", OPENAI, store=True),
    _chat("metadata", OPENAI, metadata={"team": "search"}),
    _chat("modalities-text", OPENAI, modalities=["text"]),
    _chat("reasoning_effort", OPENAI, reasoning_effort="low"),
    _chat("service_tier-auto", OPENAI, service_tier="auto"),
    _chat("service_tier-flex", OPENAI, service_tier="flex"),
    _chat("service_tier-priority", OPENAI, service_tier="priority"),
    _chat("user", OPENAI, user="user-1"),
    _chat("safety_identifier", OPENAI, safety_identifier="user-1"),
    _chat("prompt_cache_key", OPENAI, prompt_cache_key="k1"),
    _chat("verbosity", OPENAI, verbosity="low"),
    _chat(
        "system-and-history",
        OPENAI,
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Tell me about the sea."},
        ],
    ),
    _chat(
        "developer-role", OPENAI, messages=[{"role": "developer", "content": "Be brief."}, *CHAT]
    ),
    _chat(
        "content-parts",
        OPENAI,
        messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
    ),
    _chat("message-name", OPENAI, messages=[{"role": "user", "content": "Hi", "name": "ann"}]),
    _chat("top_k-min_p-repetition", VLLM, top_k=5, min_p=0.05, repetition_penalty=1.1),
    _chat("min_tokens", VLLM, min_tokens=3, logit_bias={str(EOS): 100}),
    _chat("ignore_eos", VLLM, ignore_eos=True),
    _chat("skip_special_tokens", VLLM, skip_special_tokens=False),
    _chat("spaces_between_special_tokens", VLLM, spaces_between_special_tokens=False),
    _chat("stop_token_ids", VLLM, stop_token_ids=[EOS, 13]),
    _chat("include_stop_str_in_output", VLLM, stop=["e"], include_stop_str_in_output=True),
    _chat("bad_words", VLLM, bad_words=["sea"]),
    _chat("allowed_token_ids", VLLM, allowed_token_ids=[70, 80, 90, EOS]),
    _chat("seed", VLLM, temperature=1, seed=7),
    _chat("echo", VLLM, echo=True),
    _chat("prompt_logprobs", VLLM, prompt_logprobs=1),
    _chat("truncate_prompt_tokens", VLLM, truncate_prompt_tokens=4),
    _chat("structured_outputs-regex", VLLM, structured_outputs={"regex": "(yes|no)"}),
    _chat("structured_outputs-choice", VLLM, structured_outputs={"choice": ["calm", "rough"]}),
    _chat("structured_outputs-json", VLLM, **_structured(structured_outputs={"json": WEATHER})),
    _chat("vendor-field", VENDOR, x_vendor_hint={"cache": True}),
    _chat("vendor-top-level", VENDOR, safe_prompt=False, random_seed=3),
    _chat("chat_template_kwargs", TEMPLATE, chat_template_kwargs={"enable_thinking": False}),
    _chat("add_generation_prompt", TEMPLATE, add_generation_prompt=True),
    _chat(
        "continue_final_message",
        TEMPLATE,
        messages=[*CHAT, {"role": "assistant", "content": "The sea is"}],
        add_generation_prompt=False,
        continue_final_message=True,
    ),
    _chat("tools-auto", TOOLS, tools=[TOOL], tool_choice="auto"),
    _chat("tools-none", TOOLS, tools=[TOOL], tool_choice="none"),
    _chat("tools-required", TOOLS, tools=[TOOL], tool_choice="required", **_structured()),
    _chat(
        "tools-named",
        TOOLS,
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **_structured(),
    ),
    _chat(
        "tools-no-parallel-calls",
        TOOLS,
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        **_structured(),
    ),
    _chat(
        "tool-result-turn",
        TOOLS,
        tools=[TOOL],
        messages=[
            *CHAT,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {
                            "name": "get_weather",
                            "arguments": '{"city": "Oslo", "days": 2}',
                        },
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "Sunny."},
        ],
    ),
    _chat("response_format-text", FORMAT, response_format={"type": "text"}),
    _chat(
        "response_format-json_object",
        FORMAT,
        response_format={"type": "json_object"},
        **_structured(),
    ),
    _chat("response_format-json_schema", FORMAT, response_format=SCHEMA_FORMAT, **_structured()),
    _chat("stream", STREAM, stream=True),
    _chat("stream-usage", STREAM, stream=True, stream_options={"include_usage": True}),
    _chat("stream-logprobs", STREAM, stream=True, logprobs=True, top_logprobs=1),
    _chat(
        "stream-tools-named",
        STREAM,
        stream=True,
        tools=[TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        **_structured(),
    ),
    _text("completion", PROMPTS),
    _text("prompt-list", PROMPTS, prompt=[PROMPT, "A cat sat"]),
    _text("prompt-token-ids", PROMPTS, prompt=TOKEN_IDS),
    _text("prompt-token-id-lists", PROMPTS, prompt=[TOKEN_IDS, TOKEN_IDS[:2]]),
    _text("echo", PROMPTS, echo=True),
    _text("logprobs", PROMPTS, logprobs=2),
    _text("n", PROMPTS, n=2, temperature=1, seed=1),
    _text("stop-and-bias", PROMPTS, stop=["."], logit_bias={str(EOS): -100}),
    _text("user", PROMPTS, user="user-1"),
    _text(
        "vllm-sampling", PROMPTS, top_k=5, min_tokens=2, ignore_eos=True, skip_special_tokens=False
    ),
    _text("structured_outputs-regex", PROMPTS, structured_outputs={"regex": "(yes|no)"}),
    _text("response_format-json_schema", PROMPTS, response_format=SCHEMA_FORMAT, **_structured()),
    _text("stream", PROMPTS, stream=True, stream_options={"include_usage": True}),
    _text("stream-prompt-list", PROMPTS, prompt=[PROMPT, "A cat sat"], stream=True),
    Shape(
        "response",
        "/v1/responses",
        {"input": "Tell me about the sea.", "max_output_tokens": 16, "temperature": 0},
        RESPONSES,
    ),
    Shape(
        "response-instructions-metadata",
        "/v1/responses",
        {
            "input": "Hi",
            "instructions": "Be brief.",
            "max_output_tokens": 16,
            "temperature": 0,
            "metadata": {"a": "b"},
        },
        RESPONSES,
    ),
    Shape(
        "response-stream",
        "/v1/responses",
        {"input": "Hi", "max_output_tokens": 16, "temperature": 0, "stream": True},
        RESPONSES,
    ),
    Shape(
        "response-json_schema",
        "/v1/responses",
        {
            "input": "Weather in Oslo?",
            "max_output_tokens": 200,
            "temperature": 1,
            "text": {"format": {"type": "json_schema", "name": "weather", "schema": WEATHER}},
        },
        RESPONSES,
    ),
    _chat(
        "image-part",
        REFUSED,
        ordinary=False,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": IMAGE}},
                ],
            }
        ],
    ),
    _chat("modalities-audio", REFUSED, ordinary=False, modalities=["text", "audio"]),
)
