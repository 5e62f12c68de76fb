"""Does `inferq run` keep a GPU's engine full? Its runtime (the door and its feeder, the
engine loop, the result writer on SQLite) against the paced engine (worker/engine/paced.py),
which keeps an H100's time (bench/gpu_pace/), held against the same engine with every
line queued in it from the start (one `LLM.generate` call).

    python -m bench.paced                          # the bench workload, 3,000 lines
    python -m bench.paced --mean-step-ms 10        # a card 2.5x as fast, say
    python -m bench.paced --mean-step-ms 25,10 --out bench/results/paced-COMMIT.json

`--mean-step-ms` scales the table so that the ideal's steps average that long (the H100
table's average 20 ms on the measured run's lines).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from bench import stack, workload
from bench.pace import H100, Line, file_ideal, scaled_to
from cli.demo_model import BENCH
from worker.engine.paced import PacedEngine, StepTimes


def run(
    requests: int, *, table: Path, mean_step_ms: float | None, max_num_seqs: int
) -> dict[str, float]:
    from transformers import AutoTokenizer

    from cli.local_run import LocalRun
    from cli.prompt_files import Defaults, prepare
    from inferq.settings import Settings

    model = stack.demo_model(BENCH, "bench")  # only its tokenizer is used
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests_ = workload.bulk(tokenizer, requests, context=BENCH.max_position_embeddings)
    lines = [
        Line(len(workload.chat_token_ids(tokenizer, r.prompt)), r.max_tokens) for r in requests_
    ]
    times = StepTimes.load(table)
    if mean_step_ms is not None:
        times = scaled_to(times, lines, max_num_seqs=max_num_seqs, mean_step_ms=mean_step_ms)
    settings = Settings(
        model=str(model), served_model_name=stack.MODEL_NAME, max_num_seqs=max_num_seqs
    )
    with tempfile.TemporaryDirectory() as work:
        batch_file = workload.write_batch_file(requests_, stack.MODEL_NAME, Path(work) / "in.jsonl")
        local = LocalRun(settings, state=Path(work) / "run.state")
        try:
            ready = prepare(batch_file, Defaults(model=settings.model_name), workdir=Path(work))
            batch = local.open_batch(ready.path, endpoint=ready.endpoint, name="in.jsonl")
            engine = PacedEngine(times=times, max_num_seqs=settings.engine_max_num_seqs)
            started = time.perf_counter()
            local.run(batch.id, engine=engine, stop=threading.Event(), on_progress=lambda _: None)
            seconds = time.perf_counter() - started
        finally:
            local.close()
    ideal = file_ideal(times, lines, max_num_seqs=max_num_seqs)
    return {
        "requests": requests,
        "seconds": seconds,
        "busy_seconds": engine.busy_s,
        "steps": engine.steps,
        "ideal_seconds": ideal.seconds,
        "ideal_steps": ideal.steps,
        "mean_step_ms": ideal.mean_step_ms,
        "x_ideal": ideal.seconds / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--table", type=Path, default=H100)
    parser.add_argument(
        "--mean-step-ms",
        default="",
        help="comma-separated paces to run at, e.g. 25,10 (default: the table's own)",
    )
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    args = parser.parse_args()
    paces = [float(ms) for ms in args.mean_step_ms.split(",") if ms] or [None]
    results = {}
    for pace in paces:
        result = run(
            args.requests, table=args.table, mean_step_ms=pace, max_num_seqs=args.max_num_seqs
        )
        results[f"{pace:g}ms" if pace else "table"] = result
        print(
            f"{result['requests']} lines in {result['seconds']:.2f} s ({result['steps']} engine "
            f"steps, busy {result['busy_seconds']:.2f} s); with every line queued in the engine "
            f"{result['ideal_seconds']:.2f} s ({result['ideal_steps']} steps of "
            f"{result['mean_step_ms']:.1f} ms on average): {result['x_ideal']:.3f}x the ideal"
        )
    if args.out:
        args.out.write_text(json.dumps({"inferq_run": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
