"""The GPU worker's engine loop alone, at a GPU's pace: its thread's CPU a batch line.

The engine loop (worker/loop.py) drives the paced engine (worker/engine/paced.py, the H100
table in bench/gpu_pace/) through the bench workload's 3,000 lines, fed a micro-batch at a
time as the feeder feeds it, with no store, writer, network or other process: what the
loop and the engine cost a line, without the rest of the stack's swing between runs. The
engine's own share is the CPU its calls took (the loop's metric of it); beside it, its
ideal's (bench/pace.py): the same lines run back to back, with no wait between steps.

    python -m bench.loop_cpu                  # at the table's pace
    python -m bench.loop_cpu --pace 0.1       # every step a tenth as long
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from prometheus_client import CollectorRegistry

from bench import stack
from bench.at_gpu_pace import MAX_NUM_SEQS, bench_lines
from bench.pace import H100, Line, file_ideal
from cli.demo_model import BENCH
from inferq.domain.jobs import JobOutcome, SamplingParams, engine_priority
from worker.admission import AdmissionQueue
from worker.engine.paced import PacedEngine, StepTimes
from worker.engine.protocol import EngineRequest
from worker.loop import EngineLoop
from worker.metrics import WorkerMetrics
from worker.speedometer import Speedometer

MICRO_BATCH = 64
FEED_POLL_S = 0.002


class _Ended:
    """The loop's writer: counts what ended, and says when all of it has."""

    def __init__(self, expected: int) -> None:
        self._expected = expected
        self._count = 0
        self.all = threading.Event()

    def put(self, _outcome: JobOutcome) -> None:
        self._count += 1
        if self._count == self._expected:
            self.all.set()


def run(lines: list[Line], times: StepTimes) -> dict[str, float]:
    admission = AdmissionQueue(max_batch_size=MICRO_BATCH, max_batch_delay_ms=5)
    engine = PacedEngine(times=times, max_num_seqs=MAX_NUM_SEQS)
    ended = _Ended(len(lines))
    registry = CollectorRegistry()
    loop = EngineLoop(
        engine=engine,
        engine_factory=lambda: engine,
        admission=admission,
        writer=ended,
        on_fatal=lambda _exc: ended.all.set(),
        metrics=WorkerMetrics(registry),
        speed=Speedometer(max_num_seqs=MAX_NUM_SEQS),
        max_num_seqs=MAX_NUM_SEQS,
    )
    requests = [
        EngineRequest(
            job_id=f"line-{i}",
            prompt_token_ids=[0] * line.prompt_tokens,
            sampling=SamplingParams(max_tokens=line.max_tokens),
            priority=engine_priority(0, single=False),
            bulk=True,
        )
        for i, line in enumerate(lines)
    ]

    def feed() -> None:
        for first in range(0, len(requests), MICRO_BATCH):
            while len(admission) >= MICRO_BATCH and not ended.all.is_set():
                time.sleep(FEED_POLL_S)
            admission.put(requests[first : first + MICRO_BATCH], single=False)

    threading.Thread(target=feed, name="feed", daemon=True).start()
    loop.start()
    (thread,) = [t for t in threading.enumerate() if t.name == EngineLoop.thread_name]
    assert thread.ident is not None
    clock = time.pthread_getcpuclockid(thread.ident)
    began = time.monotonic()
    ended.all.wait()
    seconds = time.monotonic() - began
    cpu_s = time.clock_gettime(clock)  # the loop's thread, from its start
    loop.stop(5)
    engine_s = registry.get_sample_value("inferq_engine_cpu_seconds_total") or 0.0
    ideal = file_ideal(times, lines, max_num_seqs=MAX_NUM_SEQS)
    per_line = 1000 / len(lines)
    return {
        "lines": len(lines),
        "seconds": round(seconds, 2),
        "steps": engine.steps,
        "loop_cpu_ms_per_line": round(per_line * cpu_s, 4),
        "paced_engine_cpu_ms_per_line": round(per_line * engine_s, 4),
        "loop_beside_the_engine_ms_per_line": round(per_line * (cpu_s - engine_s), 4),
        "ideal_engine_cpu_ms_per_line": round(per_line * ideal.cpu_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pace", type=float, default=1.0, help="each step's time, times this")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stack.demo_model(BENCH, "bench"))
    times = StepTimes.load(H100).scaled(args.pace)
    print(json.dumps({"pace": args.pace, **run(bench_lines(tokenizer), times)}))


if __name__ == "__main__":
    main()
