"""The paced engine's ideal: what the same engine does with no pipeline in front of it.

A file's ideal is every line queued in the engine from the start (one `LLM.generate`
call); with several engines, the lines dealt out between them in turn, the slowest
engine's time. Online work's ideal is the engine kept at `in_flight` requests, a new one
added the moment one ends. Both run `worker.engine.paced.PacedEngine` on a clock of their
own, so they cost no waiting and follow the same rules as the engine a benchmark's
workers run. What the engine itself spent in CPU on the way (`Ideal.cpu_s`) is what the
paced engine inside a benchmark's worker spends on the same requests: the worker's CPU
less that is the pipeline's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from inferq.domain.jobs import SamplingParams
from worker.engine.paced import PacedEngine, StepTimes
from worker.engine.protocol import EngineRequest

TABLES = Path(__file__).parent / "gpu_pace"
# The H100 calibration (bench/calibrate.py writes it; bench/RESULTS.md says where from).
H100 = TABLES / "h100-llama-3.1-8b-awq.json"


@dataclass(frozen=True)
class Line:
    """A request's lengths, all the paced engine needs of it."""

    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True)
class Ideal:
    seconds: float
    steps: int
    output_tokens: int
    # The engine's own CPU (its thread's), its requests' making apart.
    cpu_s: float = 0.0

    @property
    def mean_step_ms(self) -> float:
        return 1000 * self.seconds / self.steps


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _engine(times: StepTimes, max_num_seqs: int) -> tuple[PacedEngine, _Clock]:
    clock = _Clock()
    engine = PacedEngine(
        times=times, max_num_seqs=max_num_seqs, clock=lambda: clock.now, sleep=clock.sleep
    )
    return engine, clock


def _request(i: int, line: Line) -> EngineRequest:
    return EngineRequest(
        job_id=str(i),
        prompt_token_ids=[0] * line.prompt_tokens,
        sampling=SamplingParams(max_tokens=line.max_tokens),
    )


def file_ideal(
    times: StepTimes, lines: Sequence[Line], *, max_num_seqs: int, engines: int = 1
) -> Ideal:
    """Every line queued from the start, dealt out in turn between `engines`."""
    runs = []
    cpu_s = 0.0
    for first in range(engines):
        engine, clock = _engine(times, max_num_seqs)
        requests = [_request(i, lines[i]) for i in range(first, len(lines), engines)]
        began = time.thread_time()
        for request in requests:
            engine.add(request)
        while not engine.idle:
            engine.step()
        cpu_s += time.thread_time() - began
        runs.append((clock.now, engine.steps))
    seconds, steps = max(runs)
    return Ideal(seconds, steps, sum(line.max_tokens for line in lines), cpu_s)


def online_ideal(
    times: StepTimes, lines: Sequence[Line], *, max_num_seqs: int, in_flight: int
) -> Ideal:
    """`in_flight` requests at all times, in order, until every line has run."""
    engine, clock = _engine(times, max_num_seqs)
    queued = iter([_request(i, line) for i, line in enumerate(lines)])
    began = time.thread_time()
    for request in (next(queued) for _ in range(min(in_flight, len(lines)))):
        engine.add(request)
    while not engine.idle:
        for _ in engine.step():
            if (following := next(queued, None)) is not None:
                engine.add(following)
    cpu_s = time.thread_time() - began
    return Ideal(clock.now, engine.steps, sum(line.max_tokens for line in lines), cpu_s)


def scaled_to(
    times: StepTimes, lines: Sequence[Line], *, max_num_seqs: int, mean_step_ms: float
) -> StepTimes:
    """`times` sped up or slowed down so that `lines`' ideal steps average `mean_step_ms`."""
    ideal = file_ideal(times, lines, max_num_seqs=max_num_seqs)
    return times.scaled(mean_step_ms / ideal.mean_step_ms)
