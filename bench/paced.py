"""Does `inferq run` keep a GPU's engine full? Its runtime (the door and its feeder, the
engine loop, the result writer on SQLite) against an engine paced like a GPU's: each step
takes `--step-ms`, runs up to `--max-num-seqs` sequences one token further and keeps the
rest waiting, as vLLM's scheduler does.

    python -m bench.paced                       # the bench workload, 3,000 lines, 25 ms steps
    python -m bench.paced --requests 1000 --step-ms 10

Prints the steps the run took and the mean sequences per step, beside the steps the same
engine takes with every line queued in it from the start (one `LLM.generate` call). The
25 ms default is the Llama 3.1 8B INT4 stand-in's decode step at 256 sequences on an H100
(bench/RESULTS.md, On an H100).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from bench import stack, workload
from cli.demo_model import BENCH
from inferq.domain.jobs import Choice, JobResult
from worker.engine.protocol import EngineRequest, Finished


class PacedEngine:
    """The `Engine` interface over a scheduler of `slots` sequences whose steps take
    `step_s`; a request ends after `max_tokens` steps in a slot."""

    def __init__(self, *, slots: int, step_s: float) -> None:
        self._slots = slots
        self._step_s = step_s
        self._waiting: deque[EngineRequest] = deque()
        self._running: dict[str, tuple[EngineRequest, int]] = {}
        self.batch_sizes: list[int] = []

    def add(self, request: EngineRequest) -> None:
        self._waiting.append(request)

    def step(self) -> list[Finished]:
        while self._waiting and len(self._running) < self._slots:
            request = self._waiting.popleft()
            self._running[request.job_id] = (request, request.sampling.max_tokens)
        time.sleep(self._step_s)
        self.batch_sizes.append(len(self._running))
        finished = []
        for job_id, (request, left) in list(self._running.items()):
            if left > 1:
                self._running[job_id] = (request, left - 1)
                continue
            del self._running[job_id]
            tokens = request.sampling.max_tokens
            choice = Choice(index=0, text="", finish_reason="length", completion_tokens=tokens)
            result = JobResult(choices=(choice,), prompt_tokens=len(request.prompt_token_ids))
            finished.append(Finished(job_id=job_id, result=result))
        return finished

    def deltas(self) -> list[object]:
        return []

    def abort(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            self._running.pop(job_id, None)

    def close(self) -> None:
        self._waiting.clear()
        self._running.clear()

    def kv_cache_usage(self) -> float | None:
        return None


def steps_with_every_line_queued(lengths: Sequence[int], slots: int) -> int:
    """The steps the engine takes when every line waits in it from the start."""
    waiting, running, steps = deque(lengths), list[int](), 0
    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.popleft())
        steps += 1
        running = [left - 1 for left in running if left > 1]
    return steps


def run(requests: int, *, step_s: float, max_num_seqs: int) -> dict[str, float]:
    from transformers import AutoTokenizer

    from cli.local_run import LocalRun
    from cli.prompt_files import Defaults, prepare
    from inferq.settings import Settings

    model = stack.demo_model(BENCH, "bench")  # only its tokenizer is used
    tokenizer = AutoTokenizer.from_pretrained(model)
    lines = workload.bulk(tokenizer, requests, context=BENCH.max_position_embeddings)
    settings = Settings(
        model=str(model), served_model_name=stack.MODEL_NAME, max_num_seqs=max_num_seqs
    )
    with tempfile.TemporaryDirectory() as work:
        batch_file = workload.write_batch_file(lines, stack.MODEL_NAME, Path(work) / "in.jsonl")
        local = LocalRun(settings, state=Path(work) / "run.state")
        try:
            ready = prepare(batch_file, Defaults(model=settings.model_name), workdir=Path(work))
            batch = local.open_batch(ready.path, endpoint=ready.endpoint, name="in.jsonl")
            engine = PacedEngine(slots=settings.engine_max_num_seqs, step_s=step_s)
            started = time.perf_counter()
            local.run(batch.id, engine=engine, stop=threading.Event(), on_progress=lambda _: None)
            seconds = time.perf_counter() - started
        finally:
            local.close()
    best = steps_with_every_line_queued([line.max_tokens for line in lines], max_num_seqs)
    steps = len(engine.batch_sizes)
    return {
        "requests": requests,
        "seconds": seconds,
        "steps": steps,
        "mean_sequences": sum(engine.batch_sizes) / steps,
        "steps_every_line_queued": best,
        "x_steps": best / steps,
        "x_time": best * step_s / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--step-ms", type=float, default=25)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    args = parser.parse_args()
    result = run(args.requests, step_s=args.step_ms / 1000, max_num_seqs=args.max_num_seqs)
    print(
        f"{result['requests']} lines in {result['seconds']:.1f} s: {result['steps']} engine "
        f"steps, {result['mean_sequences']:.0f} sequences a step on average; with every line "
        f"queued in the engine {result['steps_every_line_queued']} steps "
        f"({result['x_steps']:.3f}x the steps, {result['x_time']:.3f}x the time)"
    )


if __name__ == "__main__":
    main()
