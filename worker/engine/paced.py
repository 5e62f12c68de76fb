"""The paced engine (`INFERQ_ENGINE=paced`): no model, but a GPU's time, for benchmarks.

Like vLLM's engine core, it runs its steps one after another while it has work, whether or
not the loop has collected the last step's output; a request joins the first step
scheduled after it was added (a step later with asynchronous scheduling). Each step is
scheduled as vLLM's is (running sequences first, then waiting ones by priority and
arrival, prompts in chunks under a token budget) and lasts what its `StepTimes` say a GPU
takes. A request ends after `max_tokens` tokens of placeholder text, so settings refuse
it unless benchmark engines are allowed.
"""

from __future__ import annotations

import heapq
import itertools
import json
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferq.broker.token_stream import ChoiceDelta, JobDelta
from inferq.domain.jobs import Choice, JobResult
from worker.engine.protocol import EngineRequest, Finished

# Each generated token's placeholder text: four characters, about an English token's.
TOKEN_TEXT = " tok"  # noqa: S105 - placeholder text, not a secret


@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """How long a step takes: by the tokens it schedules (milliseconds at each point of
    `tokens_ms`, linear between points and beyond the last two), plus `context_ms_per_1k`
    for each thousand tokens of context its sequences attend to."""

    tokens_ms: tuple[tuple[int, float], ...]
    context_ms_per_1k: float
    max_num_batched_tokens: int
    async_scheduling: bool = True

    @classmethod
    def load(cls, path: Path) -> StepTimes:
        """From a calibration table (JSON with these fields, and more that say where its
        figures came from)."""
        table: dict[str, Any] = json.loads(path.read_text())
        return cls(
            tokens_ms=tuple((int(n), float(ms)) for n, ms in table["tokens_ms"]),
            context_ms_per_1k=float(table["context_ms_per_1k"]),
            max_num_batched_tokens=int(table["max_num_batched_tokens"]),
            async_scheduling=bool(table.get("async_scheduling", True)),
        )

    def scaled(self, factor: float) -> StepTimes:
        """Every step `factor` times as long."""
        return StepTimes(
            tokens_ms=tuple((n, ms * factor) for n, ms in self.tokens_ms),
            context_ms_per_1k=self.context_ms_per_1k * factor,
            max_num_batched_tokens=self.max_num_batched_tokens,
            async_scheduling=self.async_scheduling,
        )

    def step_s(self, *, tokens: int, context: int) -> float:
        points = self.tokens_ms
        i = min(max(bisect_left(points, (tokens, 0.0)), 1), len(points) - 1)
        (n0, ms0), (n1, ms1) = points[i - 1], points[i]
        ms = max(ms0, ms0 + (ms1 - ms0) * (tokens - n0) / (n1 - n0))
        return (ms + self.context_ms_per_1k * context / 1000) / 1000


@dataclass(eq=False)
class _Sequence:
    """A request in the engine: its prompt still to compute, then a token a step from
    step `first_step` (the one that computes its prompt's last chunk) to `last_step`."""

    request: EngineRequest
    prompt_left: int
    first_step: int = -1
    last_step: int = -1

    @property
    def width(self) -> int:
        return self.request.sampling.sequences

    def generated(self, step: int) -> int:
        """Tokens made by the end of `step`."""
        return step - self.first_step + 1


@dataclass
class _Step:
    """Step number `number`, planned from `start_s` to `end_s`: the prompt tokens each
    sequence computes in it (the decoding ones each make a token)."""

    number: int
    start_s: float
    end_s: float
    prompts: list[tuple[_Sequence, int]] = field(default_factory=list)


@dataclass(frozen=True)
class _Output:
    finished: list[Finished]
    deltas: list[JobDelta]


class PacedEngine:
    """The `Engine` interface over a scheduler of `max_num_seqs` sequences whose steps
    take what `times` says. `clock` and `sleep` are the time it keeps (a simulation's own
    in bench/pace.py). A step costs what changes in it, not what runs."""

    def __init__(
        self,
        *,
        times: StepTimes,
        max_num_seqs: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._times = times
        self._max_num_seqs = max_num_seqs
        self._clock = clock
        self._sleep = sleep
        self._arriving: deque[tuple[float, EngineRequest]] = deque()
        self._waiting: list[tuple[int, int, _Sequence]] = []
        self._order = itertools.count()
        # Running: computing their prompts (in order), or making a token a step.
        self._prompting: dict[str, _Sequence] = {}
        self._decoding: dict[str, _Sequence] = {}
        self._streamed: dict[str, _Sequence] = {}
        self._ending: dict[int, list[_Sequence]] = {}  # decoding ones by their last step
        self._width = 0  # sequences running: a request with n completions counts n
        self._decoding_width = 0
        self._decoding_context = 0  # their tokens so far, prompts included
        self._step: _Step | None = None
        self._last_start_s: float | None = None
        self._free_at_s = 0.0
        self._outputs: deque[_Output] = deque()
        self._deltas: list[JobDelta] = []
        self.steps = 0
        self.busy_s = 0.0

    def add(self, request: EngineRequest) -> None:
        self._arriving.append((self._clock(), request))

    def step(self) -> list[Finished]:
        """The outputs of the next step to end: at once if one has, else once it does."""
        while True:
            now = self._clock()
            self._run_until(now)
            if self._outputs:
                output = self._outputs.popleft()
                self._deltas = output.deltas
                return output.finished
            if self._step is None:
                self._deltas = []
                return []
            self._sleep(max(0.0, self._step.end_s - now))

    def deltas(self) -> list[JobDelta]:
        return self._deltas

    def abort(self, job_ids: Sequence[str]) -> None:
        self._run_until(self._clock())
        gone = set(job_ids)
        self._arriving = deque(a for a in self._arriving if a[1].job_id not in gone)
        self._waiting = [w for w in self._waiting if w[2].request.job_id not in gone]
        heapq.heapify(self._waiting)
        for job_id in gone:
            if (sequence := self._prompting.pop(job_id, None)) is not None:
                self._width -= sequence.width
            elif (sequence := self._decoding.get(job_id)) is not None:
                self._ending[sequence.last_step].remove(sequence)
                self._stop_decoding(sequence, step=self.steps - 1)

    def close(self) -> None:
        self._arriving.clear()
        self._waiting.clear()
        self._prompting.clear()
        self._decoding.clear()
        self._streamed.clear()
        self._ending.clear()
        self._width = self._decoding_width = self._decoding_context = 0
        self._step = None

    def kv_cache_usage(self) -> float | None:
        return None

    @property
    def idle(self) -> bool:
        running = self._prompting or self._decoding
        return not (self._arriving or self._waiting or running or self._step)

    def _run_until(self, now: float) -> None:
        """Every step that has ended by `now`, its output kept; the next one planned."""
        while True:
            if self._step is None and not self._plan(now):
                return
            assert self._step is not None
            if self._step.end_s > now:
                return
            self._finish(self._step)
            self._step = None

    def _plan(self, now: float) -> bool:
        """Plan the next step, from when the engine is free or the first request arrives;
        False if there is nothing to run."""
        start = self._free_at_s
        if not (self._waiting or self._prompting or self._decoding):
            if not self._arriving:
                return False
            start = max(start, self._arriving[0][0])
            if start > now:
                return False
            self._last_start_s = None  # an idle engine schedules what arrived at once
        # With asynchronous scheduling a step is scheduled as the one before it starts.
        seen_by = start
        if self._times.async_scheduling and self._last_start_s is not None:
            seen_by = self._last_start_s
        while self._arriving and self._arriving[0][0] <= seen_by:
            _, request = self._arriving.popleft()
            sequence = _Sequence(request, prompt_left=len(request.prompt_token_ids))
            heapq.heappush(self._waiting, (request.priority, next(self._order), sequence))
        step = self._schedule(start)
        if step is None:
            # What arrived waits for the next step: schedule from when it is seen.
            self._last_start_s = start
            self._free_at_s = max(start, self._arriving[0][0])
            return self._plan(now)
        self._step = step
        self._last_start_s = start
        return True

    def _schedule(self, start: float) -> _Step | None:
        """Running sequences first (a token each, or their prompt's next chunk), then
        waiting ones while there are seats and tokens; None if nothing can run."""
        if not (self._waiting or self._prompting or self._decoding):
            return None
        step = _Step(number=self.steps, start_s=start, end_s=start)
        budget = self._times.max_num_batched_tokens - self._decoding_width
        context = self._decoding_context
        for sequence in self._prompting.values():
            if budget <= 0:
                break
            tokens = min(sequence.prompt_left, budget)
            context += len(sequence.request.prompt_token_ids) - sequence.prompt_left
            step.prompts.append((sequence, tokens))
            budget -= tokens
        while self._waiting and budget > 0 and self._width < self._max_num_seqs:
            _, _, sequence = heapq.heappop(self._waiting)
            self._prompting[sequence.request.job_id] = sequence
            self._width += sequence.width
            tokens = min(sequence.prompt_left, budget)
            step.prompts.append((sequence, tokens))
            budget -= tokens
        scheduled = self._times.max_num_batched_tokens - budget
        step.end_s = start + self._times.step_s(tokens=scheduled, context=context)
        return step

    def _finish(self, step: _Step) -> None:
        number = step.number
        finished: list[Finished] = []
        deltas = [_delta(s, step=number) for s in self._streamed.values()]
        # Every decoding sequence made a token; those at their last leave.
        self._decoding_context += self._decoding_width
        for sequence in self._ending.pop(number, ()):
            finished.append(self._stop_decoding(sequence, step=number))
        for sequence, tokens in step.prompts:
            job_id = sequence.request.job_id
            if self._prompting.get(job_id) is not sequence:
                continue  # aborted meanwhile
            sequence.prompt_left -= tokens
            if sequence.prompt_left:
                continue
            del self._prompting[job_id]
            # The prompt's last chunk makes the first token.
            sequence.first_step = number
            sequence.last_step = number + sequence.request.sampling.max_tokens - 1
            self._start_decoding(sequence)
            if sequence.request.stream:
                deltas.append(_delta(sequence, step=number))
            if sequence.last_step == number:
                self._ending[number].remove(sequence)
                finished.append(self._stop_decoding(sequence, step=number))
        self.steps += 1
        self.busy_s += step.end_s - step.start_s
        self._free_at_s = step.end_s
        self._outputs.append(_Output(finished, deltas))

    def _start_decoding(self, sequence: _Sequence) -> None:
        job_id = sequence.request.job_id
        self._decoding[job_id] = sequence
        self._ending.setdefault(sequence.last_step, []).append(sequence)
        self._decoding_width += sequence.width
        self._decoding_context += (len(sequence.request.prompt_token_ids) + 1) * sequence.width
        if sequence.request.stream:
            self._streamed[job_id] = sequence

    def _stop_decoding(self, sequence: _Sequence, *, step: int) -> Finished:
        """Take a decoding sequence out (it ended at `step`, or was aborted after it)."""
        job_id = sequence.request.job_id
        del self._decoding[job_id]
        self._streamed.pop(job_id, None)
        self._width -= sequence.width
        self._decoding_width -= sequence.width
        made = len(sequence.request.prompt_token_ids) + sequence.generated(step)
        self._decoding_context -= made * sequence.width
        return Finished(job_id=job_id, result=_result(sequence))


def _result(sequence: _Sequence) -> JobResult:
    request = sequence.request
    tokens = request.sampling.max_tokens
    return JobResult(
        choices=tuple(
            Choice(
                index=i,
                text=TOKEN_TEXT * tokens,
                finish_reason="length",
                completion_tokens=tokens,
            )
            for i in range(request.sampling.n)
        ),
        prompt_tokens=len(request.prompt_token_ids),
    )


def _delta(sequence: _Sequence, *, step: int) -> JobDelta:
    """The token a streamed sequence made in `step`."""
    made = sequence.generated(step)
    done = made >= sequence.request.sampling.max_tokens
    return JobDelta(
        job_id=sequence.request.job_id,
        choices=tuple(
            ChoiceDelta(
                index=i,
                text=TOKEN_TEXT,
                offset=made - 1,
                tokens=1,
                finish_reason="length" if done else None,
            )
            for i in range(sequence.request.sampling.n)
        ),
    )
