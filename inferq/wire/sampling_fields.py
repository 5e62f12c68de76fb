"""The fields a generation request may set, with their allowed ranges: how the next token
is picked (every request shape, OpenAI's Responses API too), what comes back, a job's
metadata and priority. `inferq.wire.validation` checks what ranges alone cannot."""

from __future__ import annotations

from typing import Annotated

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from inferq.domain.jobs import MAX_PRIORITY
from inferq.wire.compat import refusing
from inferq.wire.structured import OutputFields

MAX_STOP_SEQUENCES = 16
MAX_LOGPROBS = 20
# A temperature below this is greedy sampling, which vLLM runs only with n 1.
GREEDY_BELOW = 1e-5
# The most token ids (or words) a request's token lists may name.
MAX_TOKEN_LIST = 4096
# OpenAI's metadata limits, so metadata that works there works here.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512

Metadata = Annotated[
    dict[
        Annotated[str, StringConstraints(max_length=MAX_METADATA_KEY_CHARS)],
        Annotated[str, StringConstraints(max_length=MAX_METADATA_VALUE_CHARS)],
    ],
    Field(
        max_length=MAX_METADATA_PAIRS,
        description=f"Up to {MAX_METADATA_PAIRS} string pairs (keys up to "
        f"{MAX_METADATA_KEY_CHARS} characters, values up to {MAX_METADATA_VALUE_CHARS}).",
    ),
]


Priority = Annotated[
    int,
    Field(
        ge=0,
        le=MAX_PRIORITY,
        description=f"0 (the default) to {MAX_PRIORITY}: lower runs first, as in vLLM. It "
        "orders your work behind others' at the default; single jobs always go before "
        "batch lines, which a single job's priority cannot change.",
    ),
]


class SamplerFields(BaseModel):
    """How the next token is picked, with the allowed ranges: what every request shape
    shares, OpenAI's Responses API too."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0, le=2, description="0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(
        0,
        ge=-1,
        le=2**31 - 1,
        description="0 or -1 considers every token (as does any number above the vocabulary).",
    )
    min_p: float = Field(0.0, ge=0, le=1)
    stop: str | list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, description=f"Up to {MAX_STOP_SEQUENCES} strings that end generation."
    )
    seed: int | None = Field(
        None, ge=0, le=2**63 - 1, description="Same seed, same parameters: same text."
    )
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0, le=2)
    ignore_eos: bool = Field(False, description="Keep generating past end-of-sequence.")

    @field_validator("stop")
    @classmethod
    def _few_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        if isinstance(value, list) and len(value) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences are allowed")
        if isinstance(value, str) and not value:
            raise ValueError("a stop sequence must not be empty")
        return value

    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)


class SamplingBase(SamplerFields, OutputFields):
    """The sampling parameters of the completions shapes (jobs, chat and text
    completions), and what the output must look like (`inferq.wire.structured`)."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int | None = Field(
        None, ge=1, description="Most tokens to generate; the model's context caps it."
    )
    n: int = Field(1, ge=1, description="Completions to generate for the prompt.")
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None,
        description="Token id (as text) to a bias from -100 to 100, added to its logit "
        "before sampling.",
    )
    min_tokens: int = Field(
        0, ge=0, description="vLLM's: generate at least this many tokens before any stop."
    )
    stop_token_ids: list[int] | None = Field(
        None, max_length=MAX_TOKEN_LIST, description="vLLM's: token ids that end generation."
    )
    include_stop_str_in_output: bool = Field(
        False, description="vLLM's: keep the stop string that ended a choice in its text."
    )
    skip_special_tokens: bool = Field(
        True, description="vLLM's: leave special tokens out of the text."
    )
    spaces_between_special_tokens: bool = Field(
        True, description="vLLM's: put spaces between special tokens in the text."
    )
    allowed_token_ids: list[int] | None = Field(
        None,
        min_length=1,
        max_length=MAX_TOKEN_LIST,
        description="vLLM's: only these token ids may be generated.",
    )
    bad_words: list[Annotated[str, Field(min_length=1)]] | None = Field(
        None, max_length=MAX_TOKEN_LIST, description="vLLM's: words that must not be generated."
    )
    truncate_prompt_tokens: int | None = Field(
        None, ge=1, description="vLLM's: keep only the prompt's last this many tokens."
    )
    use_beam_search: bool = refusing(
        "vLLM's: refused when true (beam search is not served).", False
    )
    prompt_logprobs: int | None = Field(
        None,
        ge=0,
        le=MAX_LOGPROBS,
        description="vLLM's: return the prompt's logprobs, with this many of the most likely "
        "tokens at each prompt position besides the prompt's own; refused above 0 with "
        "`stream: true`, as vLLM's server refuses it.",
    )

    @field_validator("use_beam_search")
    @classmethod
    def _no_beam_search(cls, value: bool) -> bool:
        if value:
            raise ValueError("beam search is not supported here: sample instead (n, seed)")
        return value

    def check_streamable(self, *, stream: bool) -> None:
        """Refuse what a streamed request cannot return, naming the field (a
        `ValidationError`, as a field's own check raises): the prompt's logprobs above 0,
        which vLLM's server refuses with `stream` too."""
        if stream and self.prompt_logprobs:
            raise ValidationError.from_exception_data(
                type(self).__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError(
                            "value_error",
                            "the prompt's logprobs are not returned when streaming: leave "
                            "out stream or prompt_logprobs",
                        ),
                        loc=("prompt_logprobs",),
                        input=self.prompt_logprobs,
                    )
                ],
            )


class SamplingFields(SamplingBase):
    """The sampling parameters of a job (OpenAI's completions shape for `logprobs`)."""

    logprobs: int | None = Field(
        None, ge=0, le=MAX_LOGPROBS, description="Alternatives to return per token, with logprobs."
    )
