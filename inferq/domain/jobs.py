"""The domain: what a job is, what it asks for and what it produced. Plain typed data."""

from __future__ import annotations

import array
import dataclasses
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from inferq.domain.logprobs import (
    PromptLogprobs,
    TokenLogprob,
    prompt_logprobs_from_json,
    prompt_logprobs_to_json,
)


class JobStatus(enum.StrEnum):
    """Where a job is in its life. It only ever moves forward."""

    QUEUED = "queued"
    """Written to Postgres and published; no worker has taken it yet."""
    RUNNING = "running"
    """A GPU worker holds it under a lease and is generating."""
    SUCCEEDED = "succeeded"
    """The result is written."""
    FAILED = "failed"
    """It ended with an error that says why."""
    CANCELLED = "cancelled"
    """A client cancelled it before it finished; it produces no result."""

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})
ACTIVE_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """How to sample; the names and meanings are vLLM's (and mostly OpenAI's)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1
    logprobs: int | None = None
    ignore_eos: bool = False
    # The prompt's logprobs, with this many of the most likely tokens at each position.
    prompt_logprobs: int | None = None
    # vLLM's further sampling fields, stored only when set (`to_dict`).
    min_tokens: int = 0
    logit_bias: Mapping[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] | None = None
    stop_token_ids: tuple[int, ...] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    # A completion's text starts with its prompt (OpenAI's `echo`).
    echo: bool = False
    # What the output must match, in vLLM's StructuredOutputsParams terms: one of `json`
    # (a schema), `json_object`, `regex`, `choice` or `grammar` (`inferq.wire.structured`).
    structured: Mapping[str, Any] | None = None
    # How to read tool calls out of the output: {"type": "auto"} (the tool-call parser),
    # {"type": "required"} (a JSON array of calls) or {"type": "function", "name": ...};
    # with `"parallel": False` (`parallel_tool_calls: false`) only the first call is kept.
    # (the output is that function's arguments). None: the output is text.
    tool_choice: Mapping[str, Any] | None = None
    # An embedding job (runner `pooling`): {"input_lengths": [...], "dimensions": int | None,
    # "encoding_format": "float" | "base64"}. Its inputs' token ids are concatenated in
    # `prompt_token_ids`, split by `input_lengths`; `max_tokens` is 1 and means nothing.
    pooling: Mapping[str, Any] | None = None

    @property
    def sequences(self) -> int:
        """Engine sequences the request takes: one per completion, or one per input."""
        return len(self.pooling["input_lengths"]) if self.pooling is not None else self.n

    def to_dict(self) -> dict[str, Any]:
        # Not `dataclasses.asdict`: its deep copy is most of the cost of storing a batch line.
        data = {name: getattr(self, name) for name in _STORED_ALWAYS}
        data["stop"] = list(self.stop)
        for name, default in _STORED_WHEN_SET:
            if (value := getattr(self, name)) != default:
                data[name] = list(value) if isinstance(value, tuple) else value
        if self.logit_bias is not None:  # JSON keys are text
            data["logit_bias"] = {str(k): v for k, v in self.logit_bias.items()}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SamplingParams:
        values = {k: v for k, v in data.items() if k in _SAMPLING_NAMES}
        values["stop"] = tuple(values.get("stop") or ())
        for name in _TUPLES:
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        if values.get("logit_bias") is not None:
            values["logit_bias"] = {int(k): v for k, v in values["logit_bias"].items()}
        return cls(**values)


_SAMPLING_FIELDS = dataclasses.fields(SamplingParams)
_SAMPLING_NAMES = frozenset(f.name for f in _SAMPLING_FIELDS)
# Rarely set: left out of a stored job unless they differ from the default.
_WHEN_SET = frozenset(
    {
        "min_tokens",
        "logit_bias",
        "allowed_token_ids",
        "bad_words",
        "stop_token_ids",
        "include_stop_str_in_output",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "echo",
        "prompt_logprobs",
    }
)
_STORED_ALWAYS = tuple(f.name for f in _SAMPLING_FIELDS if f.name not in _WHEN_SET)
_STORED_WHEN_SET = tuple((f.name, f.default) for f in _SAMPLING_FIELDS if f.name in _WHEN_SET)
_TUPLES = ("allowed_token_ids", "bad_words", "stop_token_ids")


# A job's own `priority`: 0 (the default, and the most urgent a client may ask for) to
# MAX_PRIORITY; lower runs first, as in vLLM. A client can only put its own work behind
# others', never ahead of them.
MAX_PRIORITY = 9
# Batch lines come after every single job, whatever either's own priority.
_BULK_PRIORITY_OFFSET = MAX_PRIORITY + 1


def engine_priority(priority: int, *, single: bool) -> int:
    """The priority the engine schedules by: single jobs first, then the job's own."""
    return priority if single else _BULK_PRIORITY_OFFSET + priority


class ServiceTier(enum.StrEnum):
    """How an online request is scheduled (OpenAI's `service_tier`); `auto` runs as
    `default`."""

    DEFAULT = "default"
    """As a single job: ahead of batch lines."""
    PRIORITY = "priority"
    """Ahead of every other single job."""
    FLEX = "flex"
    """As batch lines run in the engine: behind every single job, preempted first, and
    counted in its tenant's share of batch work."""

    @classmethod
    def asked(cls, tier: str | None) -> ServiceTier:
        """The tier a request's `service_tier` runs at (None and `auto`: the default)."""
        return cls.DEFAULT if tier in (None, "auto") else cls(tier)

    @property
    def priority(self) -> int:
        """The job priority the tier runs at: `priority` before the most urgent a client
        may ask for (0), `flex` at the engine priority of batch lines."""
        return _TIER_PRIORITIES[self]


_TIER_PRIORITIES = {
    ServiceTier.DEFAULT: 0,
    ServiceTier.PRIORITY: -1,
    ServiceTier.FLEX: _BULK_PRIORITY_OFFSET,
}


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """A validated request, ready to be written: the prompt is already tokenized."""

    model: str
    prompt: str | None
    messages: list[dict[str, Any]] | None
    prompt_token_ids: Sequence[int]
    sampling: SamplingParams
    metadata: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    # Tokens go to Redis as they are generated, for whoever follows the job live.
    stream: bool = False
    # The served model whose workers run it, when `model` is one of its LoRA adapters.
    base: str | None = None
    # A request to OpenAI's Responses API: the fields its response object echoes
    # (`inferq.wire.responses`); None for every other kind of request.
    response: dict[str, Any] | None = None

    @property
    def served_by(self) -> str:
        """The served model whose queues carry this job."""
        return self.base or self.model


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """A function call read out of a chat's output; `arguments` is JSON text."""

    id: str
    name: str
    arguments: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(id=data["id"], name=data["name"], arguments=data["arguments"])


@dataclass(frozen=True, kw_only=True)
class Choice:
    """One generated completion (a job has `n` of them). With `tool_calls`, `text` is
    what the output said besides the calls (often nothing). `prompt_logprobs`, asked for,
    is the prompt's: every choice of a job carries it, as each choice of vLLM's text
    completions does, so it is stored and sent wherever the choices go."""

    index: int
    text: str
    finish_reason: str | None
    completion_tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    prompt_logprobs: PromptLogprobs | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {
            "index": self.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
            "logprobs": None if self.logprobs is None else [lp.to_dict() for lp in self.logprobs],
        }
        if self.tool_calls is not None:
            data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        if self.prompt_logprobs is not None:
            data["prompt_logprobs"] = prompt_logprobs_to_json(self.prompt_logprobs)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Choice:
        logprobs = data.get("logprobs")
        calls = data.get("tool_calls")
        prompt_logprobs = data.get("prompt_logprobs")
        return cls(
            index=data["index"],
            text=data["text"],
            finish_reason=data["finish_reason"],
            completion_tokens=data["completion_tokens"],
            logprobs=None if logprobs is None else tuple(map(TokenLogprob.from_dict, logprobs)),
            tool_calls=None if calls is None else tuple(map(ToolCall.from_dict, calls)),
            prompt_logprobs=(
                None if prompt_logprobs is None else prompt_logprobs_from_json(prompt_logprobs)
            ),
        )


@dataclass(frozen=True, kw_only=True)
class JobResult:
    """What the engine produced for a job."""

    choices: tuple[Choice, ...]
    prompt_tokens: int
    # An embedding job's vectors: float32, little-endian, one per input in input order,
    # concatenated (each is len(embedding) / 4 / inputs floats).
    embedding: bytes | None = None

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)


@dataclass(frozen=True, kw_only=True)
class JobError:
    """Why a job failed: a stable code and a message for people."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True, kw_only=True)
class Job:
    """A job as stored."""

    id: str
    tenant: str
    status: JobStatus
    model: str
    prompt: str | None
    messages: list[dict[str, Any]] | None
    sampling: SamplingParams
    metadata: dict[str, Any]
    prompt_tokens: int
    created_at: datetime
    attempts: int = 0
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: JobResult | None = None
    error: JobError | None = None
    batch_id: str | None = None
    custom_id: str | None = None
    priority: int = 0
    stream: bool = False
    # What a Responses API request's response echoes (JobSpec.response).
    response: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class ClaimedJob:
    """What a worker needs to run a job it has just claimed."""

    id: str
    model: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    created_at: datetime
    batch_id: str | None = None
    priority: int = 0
    stream: bool = False
    # Times a worker has taken it, this claim included.
    attempts: int = 1

    @property
    def flex(self) -> bool:
        """Whether it is a single job asked for at `service_tier: flex` (it counts in its
        tenant's share of batch work)."""
        return self.batch_id is None and self.priority == ServiceTier.FLEX.priority


@dataclass(frozen=True, kw_only=True)
class JobOutcome:
    """How a run ended, as the worker reports it to the store: a result or an error."""

    job_id: str
    result: JobResult | None = None
    error: JobError | None = None
    started_at: datetime | None = None
    # A batch line's: nobody waits on it alone, so its write may wait to share a
    # transaction with others (worker/writer.py).
    bulk: bool = False

    @property
    def status(self) -> JobStatus:
        return JobStatus.SUCCEEDED if self.error is None else JobStatus.FAILED


def pack_token_ids(token_ids: Sequence[int]) -> bytes:
    """Token ids as native int32 (little-endian on x86-64 and Arm): compact and quick to read."""
    packed = array.array("i", token_ids)
    if packed.itemsize != 4:  # pragma: no cover - no such platform in use
        raise RuntimeError("int32 arrays are required")
    return packed.tobytes()


def unpack_token_ids(data: bytes) -> list[int]:
    return array.array("i", data).tolist()
