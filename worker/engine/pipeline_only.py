"""The pipeline-only engine (`INFERQ_ENGINE=pipeline-only`): it answers at once without a
model, to measure the pipeline's own overhead (API, Redis, Postgres, the worker's loop) in
benchmarks and tests. Its answers are placeholders, so settings refuse it unless
`INFERQ_ALLOW_BENCHMARK_ENGINE` is set; never a stand-in for the real engine in feature
tests."""

from __future__ import annotations

from collections.abc import Sequence

from inferq.broker.token_stream import ChoiceDelta, JobDelta
from inferq.domain.jobs import Choice, JobResult
from inferq.wire.embeddings import FLOAT32_BYTES
from worker.engine.protocol import EngineRequest, Finished

# The length of the zero vectors it answers embeddings with.
PLACEHOLDER_DIMENSIONS = 8


class PipelineOnlyEngine:
    """Finishes every request on the next step with `max_tokens` placeholder tokens (an
    embedding with zero vectors)."""

    def __init__(self) -> None:
        self._pending: dict[str, EngineRequest] = {}
        self._deltas: list[JobDelta] = []

    def add(self, request: EngineRequest) -> None:
        self._pending[request.job_id] = request

    def step(self) -> list[Finished]:
        done = [Finished(job_id=r.job_id, result=_result(r)) for r in self._pending.values()]
        self._deltas = [_whole(f) for f in done if self._pending[f.job_id].stream]
        self._pending.clear()
        return done

    def deltas(self) -> list[JobDelta]:
        return self._deltas

    def abort(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self._pending.pop(job_id, None)

    def close(self) -> None:
        self._pending.clear()
        self._deltas = []

    def kv_cache_usage(self) -> float | None:
        return None


def _result(request: EngineRequest) -> JobResult:
    """`max_tokens` placeholder tokens per choice; for an embedding, a zero vector per input."""
    sampling = request.sampling
    if sampling.pooling is not None:
        inputs = len(sampling.pooling["input_lengths"])
        return JobResult(
            choices=(),
            prompt_tokens=len(request.prompt_token_ids),
            embedding=bytes(PLACEHOLDER_DIMENSIONS * FLOAT32_BYTES * inputs),
        )
    return JobResult(
        choices=tuple(
            Choice(
                index=i,
                text="x" * sampling.max_tokens,
                finish_reason="length",
                completion_tokens=sampling.max_tokens,
            )
            for i in range(sampling.n)
        ),
        prompt_tokens=len(request.prompt_token_ids),
    )


def _whole(finished: Finished) -> JobDelta:
    """A finished request's whole output as its one delta."""
    return JobDelta(
        job_id=finished.job_id,
        choices=tuple(
            ChoiceDelta(
                index=c.index,
                text=c.text,
                offset=0,
                tokens=c.completion_tokens,
                finish_reason=c.finish_reason,
            )
            for c in finished.result.choices
        ),
    )
