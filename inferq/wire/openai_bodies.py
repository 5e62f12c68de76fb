"""OpenAI's request bodies for chat and text completions, as inferq takes them: on the
online endpoints (`/v1/chat/completions`, `/v1/completions`) and in batch-file lines."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferq.wire.messages import ChatMessage
from inferq.wire.validation import (
    MAX_LOGPROBS,
    JobValidator,
    PreparedRequest,
    SamplingBase,
    SamplingFields,
)

_SAMPLING_NAMES = set(SamplingBase.model_fields)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = Field(
        False, description="Send one more chunk before `[DONE]` with the request's usage."
    )


class _OpenAIBody(SamplingBase):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="Accepted for compatibility; not used.")

    @model_validator(mode="after")
    def _options_need_stream(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self


class ChatBody(_OpenAIBody):
    """A chat completion request."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


class CompletionBody(_OpenAIBody):
    """A text completion request."""

    prompt: str
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)


def prepare_body(validator: JobValidator, body: ChatBody | CompletionBody) -> PreparedRequest:
    """Every check of a body but the context length (which needs its tokens)."""
    common = body.model_dump(include=_SAMPLING_NAMES, exclude_unset=True)
    if isinstance(body, ChatBody):
        if body.max_completion_tokens is not None:
            common["max_tokens"] = body.max_completion_tokens
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        return validator.prepare(
            model=body.model,
            prompt=None,
            messages=body.messages,
            sampling=SamplingFields(**common, logprobs=logprobs),
            metadata={},
        )
    return validator.prepare(
        model=body.model,
        prompt=body.prompt,
        messages=None,
        sampling=SamplingFields(**common, logprobs=body.logprobs),
        metadata={},
    )
