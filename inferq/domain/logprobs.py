"""Log-probabilities a job returns: of the tokens it generated, and of its prompt's."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class TokenLogprob:
    """One generated token's log-probability and the most likely alternatives."""

    token: str
    logprob: float
    top_logprobs: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "token": self.token,
            "logprob": self.logprob,
            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in self.top_logprobs],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenLogprob:
        return cls(
            token=data["token"],
            logprob=data["logprob"],
            top_logprobs=tuple((t["token"], t["logprob"]) for t in data["top_logprobs"]),
        )


@dataclass(frozen=True, kw_only=True)
class PromptLogprob:
    """A token's logprob at one prompt position, with its rank there (1 is the most
    likely) and its text: the prompt's own token, or one of the most likely."""

    logprob: float
    rank: int | None
    decoded_token: str | None


# The prompt's logprobs: None at the first position (nothing comes before it), then each
# position's tokens by id.
PromptLogprobs = tuple[Mapping[int, PromptLogprob] | None, ...]


def prompt_logprobs_to_json(positions: PromptLogprobs) -> list[dict[str, Any] | None]:
    """As vLLM's server sends them: token ids as text keys."""
    return [
        None
        if tokens is None
        else {str(token_id): dataclasses.asdict(lp) for token_id, lp in tokens.items()}
        for tokens in positions
    ]


def prompt_logprobs_from_json(data: Sequence[Mapping[str, Any] | None]) -> PromptLogprobs:
    return tuple(
        None
        if tokens is None
        else {int(token_id): PromptLogprob(**lp) for token_id, lp in tokens.items()}
        for tokens in data
    )
