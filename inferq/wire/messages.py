"""Chat messages as clients send them (OpenAI's shape): text or text parts, earlier tool
calls and the answers to them; and how each is handed to the chat template."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator

from inferq.wire.compat import Lenient


class TextPart(Lenient):
    type: Literal["text"]
    text: str


def _part_type(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("type"))
    return str(getattr(value, "type", None))


# A content part: only text, for the text-only models served here.
ContentPart = Annotated[
    Annotated[TextPart, Tag("text")],
    Discriminator(
        _part_type,
        custom_error_type="unsupported_content_part",
        custom_error_message="only text parts are supported: this model takes text, not "
        "images, audio or files (send the part as text, or use a multimodal model)",
    ),
]


class CalledFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: str = Field(description="The arguments as JSON text, as the call gave them.")


def _content_kind(value: Any) -> str:
    return "str" if isinstance(value, str) else "list"


# Text, or a list of parts: told apart first, so a bad part is the one error reported.
Content = Annotated[
    Annotated[str, Tag("str")] | Annotated[list[ContentPart], Tag("list")],
    Discriminator(_content_kind),
]


class MessageToolCall(BaseModel):
    """A call an earlier assistant turn made, sent back with the conversation."""

    model_config = ConfigDict(extra="forbid")

    id: str
    type: Literal["function"]
    function: CalledFunction

    def to_template_dict(self) -> dict[str, Any]:
        # Chat templates read the arguments as an object (vLLM hands them over the same way).
        try:
            arguments: Any = json.loads(self.function.arguments)
        except ValueError:
            arguments = self.function.arguments
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.function.name, "arguments": arguments},
        }


class ChatMessage(Lenient):
    """One chat message; content is text, or a list of text parts joined in order. An
    assistant turn may carry `tool_calls` instead; a `tool` turn answers one by its id.
    Other fields (an earlier answer's `refusal`, `annotations`) are ignored."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _has_content(self) -> Self:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError(
                "content is required (only an assistant turn with tool_calls may omit it)"
            )
        if self.tool_calls is not None and self.role != "assistant":
            raise ValueError("only an assistant message may carry tool_calls")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def to_template_dict(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_calls is not None:
            message["tool_calls"] = [call.to_template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message
