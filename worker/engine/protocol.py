"""What the engine loop needs from an inference engine (built by worker/engine/factory.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from inferq.broker.token_stream import JobDelta
from inferq.domain.jobs import JobResult, SamplingParams


@dataclass(frozen=True, kw_only=True)
class EngineRequest:
    """One job as the engine sees it."""

    job_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    created_at: datetime | None = None
    # vLLM's priority: lower is scheduled first (see inferq.domain.jobs.engine_priority).
    priority: int = 0
    # The model the job named: the served model, or one of its LoRA adapters.
    model: str | None = None
    # Report its new tokens after every step (`Engine.deltas`), not only its result.
    stream: bool = False
    # Batch work: a batch line, or a single job of the flex tier. It runs behind single
    # jobs (its priority says so to vLLM), and its outcome is written with batch lines'.
    bulk: bool = False


@dataclass(frozen=True, kw_only=True)
class Finished:
    """A request the engine has finished."""

    job_id: str
    result: JobResult


class Engine(Protocol):
    """An engine that takes requests one at a time and advances them all one step at a time.

    Every method is called from the engine loop's thread only.
    """

    def add(self, request: EngineRequest) -> None:
        """Start a request; raise `RequestRejected` if the engine refuses this one."""

    def step(self) -> list[Finished]:
        """Run one step; return what finished. Raise `EngineError` if the engine died."""

    def deltas(self) -> list[JobDelta]:
        """What the last step added to streamed requests (finished ones included)."""

    def abort(self, job_ids: Sequence[str]) -> None:
        """Drop requests; they produce nothing."""

    def close(self) -> None:
        """Release the engine (and its GPU memory)."""

    def kv_cache_usage(self) -> float | None:
        """Fraction of the KV cache in use, if the engine knows."""
