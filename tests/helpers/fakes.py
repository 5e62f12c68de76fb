"""A fake engine with the real `Engine` interface, for unit tests of the loop."""

from __future__ import annotations

from collections.abc import Sequence

from inferq.exceptions import EngineError, RequestRejected
from inferq.jobs import Choice, JobResult
from inferq.token_stream import ChoiceDelta, JobDelta
from worker.engine import EngineRequest, Finished


class StepEngine:
    """Each request finishes after `max_tokens` steps; every step is recorded. A streamed
    request makes one token, "t", a step (its result is all of them)."""

    def __init__(self, *, poison: str | None = None, reject: str | None = None) -> None:
        self.running: dict[str, int] = {}
        self.requests: dict[str, EngineRequest] = {}
        self.batch_sizes: list[int] = []
        self.admitted: list[str] = []
        self.aborted: list[str] = []
        self.closed = False
        self._deltas: list[JobDelta] = []
        self._poison = poison
        self._reject = reject

    def add(self, request: EngineRequest) -> None:
        if request.job_id == self._reject:
            raise RequestRejected("refused by the fake engine")
        self.running[request.job_id] = request.sampling.max_tokens
        self.requests[request.job_id] = request
        self.admitted.append(request.job_id)

    def step(self) -> list[Finished]:
        if self._poison is not None and self._poison in self.running:
            raise EngineError("the fake engine died")
        self.batch_sizes.append(len(self.running))
        done = []
        self._deltas = []
        for job_id in list(self.running):
            self.running[job_id] -= 1
            request = self.requests[job_id]
            left = self.running[job_id]
            if request.stream:
                self._deltas.append(_one_token(request, left))
            if left <= 0:
                del self.running[job_id]
                done.append(
                    Finished(
                        job_id=job_id,
                        result=JobResult(
                            choices=(
                                Choice(
                                    index=0,
                                    text="t" * request.sampling.max_tokens
                                    if request.stream
                                    else f"done {job_id}",
                                    finish_reason="length",
                                    completion_tokens=request.sampling.max_tokens,
                                ),
                            ),
                            prompt_tokens=len(request.prompt_token_ids),
                        ),
                    )
                )
        return done

    def deltas(self) -> list[JobDelta]:
        return self._deltas

    def abort(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            if self.running.pop(job_id, None) is not None:
                self.aborted.append(job_id)

    def close(self) -> None:
        self.closed = True


def _one_token(request: EngineRequest, left: int) -> JobDelta:
    made = request.sampling.max_tokens - left
    return JobDelta(
        job_id=request.job_id,
        choices=(
            ChoiceDelta(
                index=0,
                text="t",
                offset=made - 1,
                tokens=1,
                finish_reason="length" if left <= 0 else None,
            ),
        ),
    )
