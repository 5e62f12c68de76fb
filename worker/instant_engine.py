"""An engine that answers at once without a model. For measuring the pipeline's own
overhead in benchmarks; never a stand-in for the real engine in feature tests."""

from __future__ import annotations

from collections.abc import Sequence

from inferq.jobs import Choice, JobResult
from worker.engine import EngineRequest, Finished


class InstantEngine:
    """Finishes every request on the next step with `max_tokens` placeholder tokens."""

    def __init__(self) -> None:
        self._pending: dict[str, EngineRequest] = {}

    def add(self, request: EngineRequest) -> None:
        self._pending[request.job_id] = request

    def step(self) -> list[Finished]:
        done = [
            Finished(
                job_id=r.job_id,
                result=JobResult(
                    choices=tuple(
                        Choice(
                            index=i,
                            text="x" * r.sampling.max_tokens,
                            finish_reason="length",
                            completion_tokens=r.sampling.max_tokens,
                        )
                        for i in range(r.sampling.n)
                    ),
                    prompt_tokens=len(r.prompt_token_ids),
                ),
            )
            for r in self._pending.values()
        ]
        self._pending.clear()
        return done

    def abort(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self._pending.pop(job_id, None)

    def close(self) -> None:
        self._pending.clear()

    def kv_cache_usage(self) -> float | None:
        return None
