"""Validating generation requests: field ranges (pydantic) and prompt length (tokenizer).

Shared by the API's `/v1/jobs` and, through the same validator, by batch-file lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferq.domain.jobs import JobSpec, SamplingParams
from inferq.exceptions import InvalidRequest
from inferq.wire.messages import ChatMessage
from inferq.wire.prompts import PromptRenderer
from inferq.wire.sampling_fields import (
    GREEDY_BELOW,
    SamplingFields,
)
from inferq.wire.structured import OutputPlan, plan


def check_storable(text: str, param: str) -> None:
    """A string that is not Unicode (an unpaired surrogate) can be neither stored nor
    tokenized; say so instead of failing. NUL is stored (`inferq.store.text_codec`)."""
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            f"{param} contains an unpaired UTF-16 surrogate at position {exc.start}: "
            "send valid Unicode",
            param=param,
        ) from exc


@dataclass(frozen=True, kw_only=True)
class PreparedRequest:
    """A request past every check but the context: its text waits to be tokenized."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    text: str
    add_special_tokens: bool
    sampling: SamplingFields
    metadata: dict[str, Any]
    output: OutputPlan
    # A Responses API request's echo (`inferq.wire.responses`), kept with its job.
    response: dict[str, Any] | None = None
    # A prompt given as token ids: tokenized already.
    token_ids: list[int] | None = None
    # The completion's text starts with its prompt (OpenAI's `echo`).
    echo: bool = False


class JobValidator:
    """Checks what pydantic cannot: the model name, `n`, and the prompt against the context."""

    def __init__(
        self,
        renderer: PromptRenderer,
        *,
        model_name: str,
        base: str | None = None,
        default_max_tokens: int,
        max_n: int,
        max_tokens_cap: int,
        tool_call_parser: str | None = None,
    ) -> None:
        self._renderer = renderer
        self.model_name = model_name
        self._base = base
        self._default_max_tokens = min(default_max_tokens, max_tokens_cap)
        self._max_n = max_n
        self._max_tokens_cap = max_tokens_cap
        self._tool_call_parser = tool_call_parser

    def spec(
        self,
        *,
        model: str | None,
        prompt: str | None,
        messages: list[ChatMessage] | None,
        sampling: SamplingFields,
        metadata: dict[str, Any],
    ) -> JobSpec:
        """A `JobSpec`, or `InvalidRequest` naming the field and the limit it broke."""
        prepared = self.prepare(
            model=model, prompt=prompt, messages=messages, sampling=sampling, metadata=metadata
        )
        [token_ids] = self._renderer.encode_many(
            [prepared.text], add_special_tokens=prepared.add_special_tokens
        )
        return self.finish(prepared, token_ids)

    def prepare(
        self,
        *,
        model: str | None,
        prompt: str | None,
        messages: list[ChatMessage] | None,
        sampling: SamplingFields,
        metadata: dict[str, Any],
        template: Mapping[str, Any] | None = None,
    ) -> PreparedRequest:
        """Every check but the context length, which needs the token count; `template`:
        options for the chat template (`PromptRenderer.chat_text`)."""
        if model is not None and model != self.model_name:
            raise InvalidRequest(
                f"model {model!r} is not served here; this deployment serves {self.model_name!r}",
                param="model",
                code="model_not_found",
            )
        if sampling.n > self._max_n:
            raise InvalidRequest(f"n is {sampling.n}, over the limit of {self._max_n}", param="n")
        if sampling.n > 1 and sampling.temperature < GREEDY_BELOW:
            raise InvalidRequest(
                f"n is {sampling.n}, but temperature 0 (greedy) has one answer: ask n 1, or "
                "a temperature above 0",
                param="n",
            )
        if (prompt is None) == (messages is None):
            raise InvalidRequest("give exactly one of `prompt` and `messages`", param="prompt")
        if sampling.max_tokens is not None and sampling.max_tokens > self._max_tokens_cap:
            raise InvalidRequest(
                f"max_tokens is {sampling.max_tokens}, over the limit of {self._max_tokens_cap}",
                param="max_tokens",
            )
        _check_texts(prompt, messages, metadata, sampling)
        self._check_token_ids(sampling)
        output = plan(sampling, chat=messages is not None)
        if output.structured is not None:  # stored with the job's sampling parameters
            _check_stored_json(output.structured, _shaped_by(sampling))
        auto = output.tool_choice is not None and output.tool_choice["type"] == "auto"
        if auto and self._tool_call_parser is None:
            raise InvalidRequest(
                "tool_choice auto needs a tool-call parser for this model: set "
                "INFERQ_TOOL_CALL_PARSER, or force a call with tool_choice required",
                param="tool_choice",
            )
        if messages is not None:
            if not messages:
                raise InvalidRequest("`messages` must not be empty", param="messages")
            template_messages = [m.to_template_dict() for m in messages]
            return PreparedRequest(
                prompt=None,
                messages=template_messages,
                text=self._renderer.chat_text(
                    template_messages, tools=output.tools, options=template
                ),
                add_special_tokens=False,
                sampling=sampling,
                metadata=metadata,
                output=output,
            )
        assert prompt is not None
        return PreparedRequest(
            prompt=prompt,
            messages=None,
            text=prompt,
            add_special_tokens=True,
            sampling=sampling,
            metadata=metadata,
            output=output,
        )

    def token_prompt(self, token_ids: list[int], param: str = "prompt") -> str:
        """The text of a prompt given as token ids, or `InvalidRequest` for an id outside
        the vocabulary."""
        vocab = self._renderer.vocab_size
        if not token_ids:
            raise InvalidRequest("a prompt of token ids must not be empty", param=param)
        for token in token_ids:
            if not 0 <= token < vocab:
                raise InvalidRequest(
                    f"{param} holds token id {token}, outside this model's vocabulary "
                    f"(0 to {vocab - 1})",
                    param=param,
                )
        return self._renderer.decode(token_ids)

    def _check_token_ids(self, sampling: SamplingFields) -> None:
        """Every token id a request names is in the model's vocabulary."""
        vocab = self._renderer.vocab_size
        named: list[tuple[str, list[str] | list[int]]] = [
            ("logit_bias", list(sampling.logit_bias or ())),
            ("stop_token_ids", sampling.stop_token_ids or []),
            ("allowed_token_ids", sampling.allowed_token_ids or []),
        ]
        for param, ids in named:
            for token in ids:
                number = _token_id(token, param)
                if not 0 <= number < vocab:
                    raise InvalidRequest(
                        f"{param} names token id {token}, outside this model's vocabulary "
                        f"(0 to {vocab - 1})",
                        param=param,
                    )

    def finish(self, prepared: PreparedRequest, token_ids: list[int]) -> JobSpec:
        """The `JobSpec`, once the prompt is tokenized and fits the context."""
        sampling = prepared.sampling
        if sampling.truncate_prompt_tokens is not None:  # vLLM keeps the end
            token_ids = token_ids[-sampling.truncate_prompt_tokens :]
        prompt_param = "messages" if prepared.messages is not None else "prompt"
        max_tokens = self._max_tokens(len(token_ids), sampling.max_tokens, prompt_param)
        if sampling.min_tokens > max_tokens:
            raise InvalidRequest(
                f"min_tokens is {sampling.min_tokens}, over max_tokens ({max_tokens})",
                param="min_tokens",
            )
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            min_p=sampling.min_p,
            stop=sampling.stop_sequences(),
            seed=sampling.seed,
            presence_penalty=sampling.presence_penalty,
            frequency_penalty=sampling.frequency_penalty,
            repetition_penalty=sampling.repetition_penalty,
            n=sampling.n,
            logprobs=sampling.logprobs,
            prompt_logprobs=sampling.prompt_logprobs,
            ignore_eos=sampling.ignore_eos,
            min_tokens=sampling.min_tokens,
            logit_bias=_logit_bias(sampling.logit_bias),
            allowed_token_ids=_tuple(sampling.allowed_token_ids),
            bad_words=_tuple(sampling.bad_words),
            stop_token_ids=_tuple(sampling.stop_token_ids),
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            skip_special_tokens=sampling.skip_special_tokens,
            spaces_between_special_tokens=sampling.spaces_between_special_tokens,
            echo=prepared.echo,
            structured=prepared.output.structured,
            tool_choice=prepared.output.tool_choice,
        )
        return JobSpec(
            model=self.model_name,
            base=self._base,
            prompt=prepared.prompt,
            messages=prepared.messages,
            prompt_token_ids=token_ids,
            sampling=params,
            metadata=prepared.metadata,
            response=prepared.response,
        )

    def encode(self, prepared: Sequence[PreparedRequest]) -> list[list[int]]:
        """Token ids of many prepared requests, raw prompts and chats each in one call."""
        ids: list[list[int]] = [p.token_ids or [] for p in prepared]
        for special in (True, False):
            picked = [
                i
                for i, p in enumerate(prepared)
                if p.add_special_tokens is special and p.token_ids is None
            ]
            encoded = self._renderer.encode_many(
                [prepared[i].text for i in picked], add_special_tokens=special
            )
            for i, token_ids in zip(picked, encoded, strict=True):
                ids[i] = token_ids
        return ids

    def _max_tokens(self, prompt_tokens: int, asked: int | None, prompt_param: str) -> int:
        context = self._renderer.context_len
        room = context - prompt_tokens
        if room < 1:
            raise InvalidRequest(
                f"the prompt is {prompt_tokens} tokens, which leaves no room to generate in "
                f"the model's context of {context} tokens: shorten it",
                param=prompt_param,
                code="context_length_exceeded",
            )
        if asked is None:
            return min(self._default_max_tokens, room)
        if asked > room:
            raise InvalidRequest(
                f"the prompt is {prompt_tokens} tokens and max_tokens is {asked}: together "
                f"{prompt_tokens + asked}, over the model's context of {context} tokens; "
                f"lower max_tokens to at most {room} or shorten the prompt",
                param="max_tokens",
                code="context_length_exceeded",
            )
        return asked


def _token_id(token: str | int, param: str) -> int:
    if isinstance(token, int):
        return token
    try:
        return int(token)
    except ValueError:
        raise InvalidRequest(
            f'{param} keys are token ids (as text, like "50256"), not {token!r}', param=param
        ) from None


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    return None if not bias else {int(k): v for k, v in bias.items()}


def _tuple(values: list[Any] | None) -> tuple[Any, ...] | None:
    return None if values is None else tuple(values)


def _check_stored_json(value: Any, param: str) -> None:
    """`check_storable` for every string in a JSON value (keys too)."""
    if isinstance(value, str):
        check_storable(value, param)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_storable(str(key), param)
            _check_stored_json(item, param)
    elif isinstance(value, list):
        for item in value:
            _check_stored_json(item, param)


def _shaped_by(sampling: SamplingFields) -> str:
    """The field that set a request's structured output."""
    if sampling.structured_outputs is not None:
        return "structured_outputs"
    return "response_format" if sampling.response_format is not None else "tools"


def _check_texts(
    prompt: str | None,
    messages: list[ChatMessage] | None,
    metadata: dict[str, Any],
    sampling: SamplingFields,
) -> None:
    if prompt is not None:
        check_storable(prompt, "prompt")
    for i, message in enumerate(messages or ()):
        check_storable(message.text(), f"messages.{i}.content")
        if message.name is not None:
            check_storable(message.name, f"messages.{i}.name")
        if message.tool_calls is not None or message.tool_call_id is not None:
            stored = message.model_dump(include={"tool_calls", "tool_call_id"})
            _check_stored_json(stored, f"messages.{i}")
    for key, value in metadata.items():
        check_storable(f"{key}{value}", "metadata")
    for stop in sampling.stop_sequences():
        check_storable(stop, "stop")
    for word in sampling.bad_words or ():
        check_storable(word, "bad_words")
