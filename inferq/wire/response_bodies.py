"""The body of a request to OpenAI's Responses API (`/v1/responses`), online and in
batch-file lines, as inferq takes it: text or a list of input items (messages, function
calls and their outputs), instructions, sampling, `text.format` and function tools. What
it becomes is `inferq.wire.responses`."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from inferq.wire.compat import Lenient, ignored
from inferq.wire.sampling_fields import MAX_LOGPROBS, Metadata, SamplerFields
from inferq.wire.structured import (
    MAX_TOOLS,
    JsonObjectFormat,
    TextFormat,
)

RESPONSE_ID_PREFIX = "resp_"
LOGPROBS_INCLUDE = "message.output_text.logprobs"
_NAME = r"^[A-Za-z0-9_-]{1,64}$"
SAMPLER_NAMES = set(SamplerFields.model_fields)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputText(_Strict):
    type: Literal["input_text"]
    text: str


class OutputText(_Strict):
    """Text of an earlier response's message, sent back as input."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] | None = None


class MessageItem(_Strict):
    """A turn of the conversation. `id`, `status` and `phase` are accepted so that an
    earlier response's output items can be sent back as they came."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Annotated[InputText | OutputText, Field(discriminator="type")]]
    id: str | None = None
    status: str | None = None
    phase: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class FunctionCallItem(_Strict):
    """A function call an earlier response made."""

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutputItem(_Strict):
    """What a function call returned, for the model to go on from."""

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[InputText]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(part.text for part in self.output)


def _item_type(value: Any) -> str:
    """An input item's `type`; a message may leave it out (OpenAI's easy input)."""
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", "message"))


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(
        _item_type,
        custom_error_type="invalid_input_item",
        custom_error_message="an input item's type must be message, function_call or "
        "function_call_output (images, files and other items are not supported)",
    ),
]


class FunctionTool(_Strict):
    """A function the model may call (the only kind of tool served here)."""

    type: Literal["function"]
    name: str = Field(pattern=_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = Field(
        None, description="A JSON Schema of the arguments; any object if left out."
    )
    strict: bool | None = Field(None, description="Accepted: the arguments always match.")


class FunctionChoice(_Strict):
    type: Literal["function"]
    name: str


class JsonSchemaTextFormat(_Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["json_schema"]
    name: str = Field(pattern=_NAME)
    schema_: dict[str, Any] = Field(alias="schema", description="What the output must match.")
    description: str | None = None
    strict: bool | None = Field(None, description="Accepted: the schema is always enforced.")


class TextConfig(_Strict):
    format: Annotated[
        TextFormat | JsonObjectFormat | JsonSchemaTextFormat, Field(discriminator="type")
    ] = Field(default_factory=lambda: TextFormat(type="text"))
    verbosity: Literal["low", "medium", "high"] | None = Field(
        None, description="Accepted for compatibility; not used."
    )


class ResponsesStreamOptions(_Strict):
    include_obfuscation: bool | None = Field(
        None, description="Accepted for compatibility: events carry no padding."
    )


class ResponsesBody(SamplerFields, Lenient):
    """A request to OpenAI's Responses API, as `/v1/responses` and batch lines take it;
    the sampling fields beyond OpenAI's (`top_k`, `seed`, `stop`, ...) are vLLM's. Fields
    it does not know are ignored."""

    model_config = ConfigDict(extra="ignore")

    model: str
    input: str | Annotated[list[InputItem], Field(min_length=1)]
    instructions: str | None = Field(None, description="The system message, before `input`.")
    max_output_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    include: list[Literal["message.output_text.logprobs"]] | None = None
    tools: list[FunctionTool] | None = Field(None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    metadata: Metadata | None = None
    stream: bool = False
    stream_options: ResponsesStreamOptions | None = None
    store: bool = Field(True, description="Keep the response, to be read back by its id.")
    background: bool = Field(
        False, description="Answer at once (status `queued`); read the response back later."
    )
    previous_response_id: str | None = Field(
        None, description="A stored response whose conversation this one continues."
    )
    truncation: Literal["disabled"] | None = Field(
        None, description="Only `disabled`: an input too long for the context is refused."
    )
    user: str | None = ignored("an end-user id for OpenAI's abuse monitoring.")
    safety_identifier: str | None = ignored("an end-user id for OpenAI's abuse monitoring.")
    prompt_cache_key: str | None = ignored("prefix caching is automatic.")
    reasoning: dict[str, Any] | None = ignored(
        "the chat template is rendered without a reasoning effort."
    )
    service_tier: Literal["auto", "default", "flex", "priority"] | None = Field(
        None,
        description="`priority` runs ahead of other single jobs; `flex` as batch work "
        "does, behind every single job and in the tenant's share of batch work; `auto` "
        "and `default` as a single job.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        if self.background and not self.store:
            raise ValueError("background needs store true: a background response is read back")
        return self

    def input_chars(self) -> int:
        if isinstance(self.input, str):
            return len(self.input)
        return sum(len(json.dumps(item.model_dump(), ensure_ascii=False)) for item in self.input)

    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None or LOGPROBS_INCLUDE in (self.include or ())
