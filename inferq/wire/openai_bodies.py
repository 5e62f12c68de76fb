"""OpenAI's request bodies for chat and text completions, as inferq takes them: on the
online endpoints (`/v1/chat/completions`, `/v1/completions`) and in batch-file lines."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, field_validator, model_validator

from inferq.exceptions import InvalidRequest
from inferq.wire.compat import Lenient, ignored, refusing
from inferq.wire.messages import ChatMessage
from inferq.wire.sampling_fields import MAX_LOGPROBS, SamplingBase, SamplingFields
from inferq.wire.validation import JobValidator, PreparedRequest

_SAMPLING_NAMES = set(SamplingBase.model_fields)
# What the chat template is called with by inferq itself, not by `chat_template_kwargs`.
_TEMPLATE_NAMES = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "tokenize",
        "return_dict",
        "return_tensors",
        "add_generation_prompt",
        "continue_final_message",
    }
)


ServiceTier = Literal["auto", "default", "flex", "priority"]


class StreamOptions(Lenient):
    include_usage: bool = Field(
        False, description="Send one more chunk before `[DONE]` with the request's usage."
    )


class _OpenAIBody(SamplingBase, Lenient):
    model_config = ConfigDict(extra="ignore")

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    service_tier: ServiceTier | None = Field(
        None,
        description="`priority` runs ahead of other single jobs; `flex` runs as batch work "
        "does, behind every single job and in the tenant's share of batch work; `auto` "
        "and `default` (the default) as a single job. The answer's `service_tier` says which ran.",
    )
    user: str | None = ignored("an end-user id for OpenAI's abuse monitoring.")
    store: bool | None = ignored("every request is kept as a job (see `/v1/jobs`) anyway.")
    metadata: dict[str, Any] | None = ignored(
        "OpenAI keeps it with stored completions; give `/v1/jobs` its own `metadata`."
    )
    safety_identifier: str | None = ignored("an end-user id for OpenAI's abuse monitoring.")
    prompt_cache_key: str | None = ignored("prefix caching is automatic.")

    @model_validator(mode="after")
    def _options_need_stream(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed when stream is true")
        return self

    @model_validator(mode="after")
    def _streamable(self) -> Self:
        self.check_streamable(stream=self.stream)
        return self


class ChatBody(_OpenAIBody):
    """A chat completion request."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    modalities: list[str] | None = refusing(
        'Only `["text"]`: the model answers in text (audio output is refused).'
    )
    add_generation_prompt: bool = Field(
        True, description="vLLM's: end the prompt with the assistant's turn opening."
    )
    continue_final_message: bool = Field(
        False,
        description="vLLM's: the last message (the assistant's) is continued, not closed; "
        "needs `add_generation_prompt` false.",
    )
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="vLLM's: more variables for the model's chat template."
    )
    reasoning_effort: str | None = Field(
        None,
        description="Handed to the chat template as `reasoning_effort`: a reasoning model's "
        "template reads it; any other template ignores it.",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _own_names(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        taken = sorted((value or {}).keys() & _TEMPLATE_NAMES)
        if taken:
            raise ValueError(f"{', '.join(taken)} cannot be set here: these are the request's")
        return value

    @model_validator(mode="after")
    def _one_ending(self) -> Self:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError(
                "continue_final_message needs add_generation_prompt false: the last message "
                "is continued, so no new turn opens"
            )
        return self

    def template_options(self) -> dict[str, Any]:
        """What the chat template is rendered with besides the messages and tools."""
        options = {
            **(self.chat_template_kwargs or {}),
            "add_generation_prompt": self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
        }
        if self.reasoning_effort is not None:
            options["reasoning_effort"] = self.reasoning_effort
        return options

    @field_validator("modalities")
    @classmethod
    def _text_only(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and set(value) - {"text"}:
            raise ValueError(
                f"this model answers in text only: modalities {value} cannot be honoured; "
                'send ["text"] or leave it out'
            )
        return value


# One prompt: text, or token ids.
Prompt = str | Annotated[list[int], Field(min_length=1)]


class CompletionBody(_OpenAIBody):
    """A text completion request."""

    prompt: Prompt | Annotated[list[Prompt], Field(min_length=1)] = Field(
        description="Text or token ids to complete, or a list of them: one choice each (`n` "
        "each), indexed in order."
    )
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    echo: bool = Field(False, description="Start each choice's text with its prompt.")
    suffix: str | None = refusing(
        "Refused: text after the completion (insertion) is not supported, as in vLLM's server."
    )

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value is not None:
            raise ValueError("suffix is not supported: put the whole text in prompt")
        return value

    @model_validator(mode="after")
    def _echo_without_logprobs(self) -> Self:
        if self.echo and self.logprobs is not None:
            raise ValueError("echo with logprobs is not supported: leave out one of them")
        return self

    def prompts(self) -> list[str | list[int]]:
        """Each prompt the request gives, in order."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(token, int) for token in self.prompt):
            return [self.prompt]  # type: ignore[list-item]
        return list(self.prompt)  # type: ignore[arg-type]


def prepare_prompts(validator: JobValidator, body: CompletionBody) -> list[PreparedRequest]:
    """Each prompt of a completion request, checked but for the context length."""
    prompts = body.prompts()
    return [
        _prepare_prompt(validator, body, prompt, "prompt" if len(prompts) == 1 else f"prompt.{i}")
        for i, prompt in enumerate(prompts)
    ]


def prepare_body(validator: JobValidator, body: ChatBody | CompletionBody) -> PreparedRequest:
    """Every check of a body of one prompt but the context length (which needs its tokens)."""
    if isinstance(body, CompletionBody):
        prompts = body.prompts()
        if len(prompts) != 1:
            raise InvalidRequest(
                f"prompt holds {len(prompts)} prompts; give one here (one per batch line)",
                param="prompt",
            )
        return _prepare_prompt(validator, body, prompts[0], "prompt")
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
            template=body.template_options(),
        )
    raise AssertionError("unreachable")


def _prepare_prompt(
    validator: JobValidator, body: CompletionBody, prompt: str | list[int], param: str
) -> PreparedRequest:
    common = body.model_dump(include=_SAMPLING_NAMES, exclude_unset=True)
    token_ids = None
    if not isinstance(prompt, str):
        token_ids = list(prompt)
        prompt = validator.token_prompt(token_ids, param)
    prepared = validator.prepare(
        model=body.model,
        prompt=prompt,
        messages=None,
        sampling=SamplingFields(**common, logprobs=body.logprobs),
        metadata={},
    )
    return dataclasses.replace(prepared, token_ids=token_ids, echo=body.echo)
