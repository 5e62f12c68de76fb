"""Batch estimates against what happened: how far from a batch's real end the end it was
told came, into an idle and into a busy system.

    python -m bench.estimates                      # 200, 2,000 and 20,000 lines
    python -m bench.estimates --sizes 200,2000 --out bench/results

One deployment on the real engine (the bench model and engine settings of bench.compare).
First a warm-up batch, so the worker has measured its engine (as in a deployment that has
worked before). Then, for each size, a batch of the bench workload submitted into the
idle system, and one submitted into a busy system: behind a batch of `--ahead-lines`
lines already running, with single jobs arriving as a Poisson process at
`--interactive-rate` a second, both going for `--busy-for` seconds before it is
submitted (the system in its busy state, as a client would find it), and the single jobs
until it ends. Every batch has prompts of its own (a seed each), so none runs from the
engine's prefix cache.

While a batch runs its estimate is read from Postgres every `--sample-s` (there it has
microseconds; the API gives whole seconds), with its ended lines; its real end is its last
line's `finished_at`. The error of an estimate made at time t is (estimated end - real
end) / (real end - creation): a share of the batch's whole time, negative when it said
too early. Reported: at submission, at the first sample with 10% of its lines ended (and
there also as a share of the time then left), and the largest over every sample from
10% on. The goal: within 25% once 10% of the batch has run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from bench import drive, priority, workload
from bench.compare import engine_args, inferq_env
from bench.peers import SERVED
from bench.stack import demo_model, deployment
from cli.demo_model import BENCH

GOAL = 0.25
WARM_UP_LINES = 600


@dataclass(frozen=True)
class Sample:
    at: datetime
    status: str
    total: int
    ended: int
    estimate: dict[str, Any] | None


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="200,2000,20000")
    parser.add_argument("--ahead-lines", type=int, default=4000)
    parser.add_argument("--busy-for", type=float, default=30.0)
    parser.add_argument("--interactive-rate", type=float, default=2.0)
    parser.add_argument("--sample-s", type=float, default=0.5)
    parser.add_argument("--scenarios", default="idle,busy")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    return parser.parse_args()


def _sample(dsn: str, batch_id: str) -> Sample:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT now(), status, request_total, request_completed + request_failed, estimate "
            "FROM batches WHERE id = %s",
            (batch_id,),
        ).fetchone()
    assert row is not None
    return Sample(at=row[0], status=row[1], total=row[2], ended=row[3], estimate=row[4])


def _ends(dsn: str, batch_id: str) -> tuple[datetime, datetime, int]:
    """When the batch was created, when its last line ended, and its output tokens."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT b.created_at, max(j.finished_at), b.output_tokens FROM batches b "
            "JOIN jobs j ON j.batch_id = b.id WHERE b.id = %s GROUP BY b.id",
            (batch_id,),
        ).fetchone()
    assert row is not None
    return row[0], row[1], row[2]


def _when(estimate: dict[str, Any], key: str = "completion_at") -> datetime:
    return datetime.fromisoformat(estimate[key])


def summary(samples: list[Sample], *, created: datetime, ended: datetime) -> dict[str, Any]:
    """The errors of the estimates a batch carried, as the module says."""
    whole_s = (ended - created).total_seconds()

    def error(sample: Sample) -> float | None:
        if sample.estimate is None:
            return None
        return (_when(sample.estimate) - ended).total_seconds() / whole_s

    first = next((s for s in samples if s.estimate is not None), None)
    tenth = next((s for s in samples if s.ended >= 0.1 * s.total and s.estimate), None)
    later = [e for s in samples if s.ended >= 0.1 * s.total and (e := error(s)) is not None]
    result: dict[str, Any] = {
        "lines": samples[-1].total,
        "seconds": whole_s,
        "samples": len(samples),
        "error_at_submission": None if first is None else error(first),
        "error_at_10pct": None if tenth is None else error(tenth),
        "max_abs_error_from_10pct": max(map(abs, later)) if later else None,
    }
    if tenth is not None and tenth.estimate is not None:
        left_s = (ended - tenth.at).total_seconds()
        result["error_at_10pct_of_time_left"] = (
            (_when(tenth.estimate) - ended).total_seconds() / left_s if left_s > 0 else None
        )
        result["inside_interval_at_10pct"] = (
            _when(tenth.estimate, "earliest_at") <= ended <= _when(tenth.estimate, "latest_at")
        )
    if first is not None and first.estimate is not None:
        result["output_tokens_estimated"] = first.estimate["output_tokens"]
        result["tokens_ahead_at_submission"] = first.estimate["tokens_ahead"]
        result["tokens_per_s_at_submission"] = first.estimate["tokens_per_s"]
    result["within_goal"] = result["max_abs_error_from_10pct"] is not None and (
        result["max_abs_error_from_10pct"] <= GOAL
    )
    # Where the error came from: about forty samples, evenly spread, with what the estimate
    # was made of then.
    shown = [s for s in samples if s.estimate is not None]
    result["trace"] = [
        {
            "s": round((s.at - created).total_seconds(), 1),
            "ended": s.ended,
            "error": error(s),
            **{k: s.estimate.get(k) for k in ("output_tokens", "tokens_per_s", "tokens_ahead")},
        }
        for s in shown[:: max(1, len(shown) // 40)]
        if s.estimate is not None
    ]
    return result


async def _arrivals(
    client: aiohttp.ClientSession, body: dict[str, Any], rate: float, stop: asyncio.Event
) -> int:
    """Single jobs as a Poisson process until `stop`; how many ended."""
    rng = random.Random(workload.SEED)
    jobs: list[asyncio.Task[float]] = []
    while not stop.is_set():
        jobs.append(asyncio.create_task(drive.timed_job(client, body)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rng.expovariate(rate))
    return len(await asyncio.gather(*jobs))


async def run_batch(
    client: aiohttp.ClientSession,
    dsn: str,
    batch_file: Path,
    *,
    ahead_file: Path | None,
    body: dict[str, Any],
    rate: float,
    sample_s: float,
    busy_for_s: float = 0.0,
) -> dict[str, Any]:
    """One batch from submission to its end, its estimate sampled as it runs."""
    stop = asyncio.Event()
    load: asyncio.Task[int] | None = None
    if ahead_file is not None:
        ahead = await priority.submit(client, ahead_file)
        await priority.wait_until_completing(client, ahead)
        load = asyncio.create_task(_arrivals(client, body, rate, stop))
        await asyncio.sleep(busy_for_s)
        if (await priority.progress(client, ahead)).status in priority.ENDED:
            raise RuntimeError(
                "the batch ahead ended before the one measured came: give more --ahead-lines"
            )
    batch_id = await priority.submit(client, batch_file)
    samples = []
    while True:
        sample = await asyncio.to_thread(_sample, dsn, batch_id)
        samples.append(sample)
        if sample.ended >= sample.total or sample.status in priority.ENDED:
            break
        await asyncio.sleep(sample_s)
    stop.set()
    single_jobs = await load if load is not None else 0
    created, ended, output_tokens = await asyncio.to_thread(_ends, dsn, batch_id)
    result = summary(samples, created=created, ended=ended)
    result["output_tokens"] = output_tokens
    result["single_jobs_meanwhile"] = single_jobs
    return result


def main() -> None:
    args = _parse()
    from transformers import AutoTokenizer

    model = demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=False)
    tokenizer = AutoTokenizer.from_pretrained(model)
    workdir = args.out / "work" / "estimates"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    sizes = [int(size) for size in args.sizes.split(",")]
    seeds = iter(range(workload.SEED + 100, workload.SEED + 1000))

    def batch_file(lines: int, name: str) -> Path:
        requests = workload.bulk(
            tokenizer, lines, context=engine["max_model_len"], seed=next(seeds)
        )
        return workload.write_batch_file(requests, SERVED, workdir / f"{name}.jsonl")

    body = workload.body(
        workload.bulk(tokenizer, 1, context=engine["max_model_len"], seed=next(seeds))[0], SERVED
    )
    results: dict[str, Any] = {"engine": {k: v for k, v in engine.items() if k != "model"}}
    with deployment(model, workdir, **inferq_env(engine)) as running:
        dsn = running.env["INFERQ_DATABASE_URL"].replace("+psycopg", "")

        async def run() -> None:
            async with drive.inferq_session(
                running.url, connections=drive.OPEN_LOOP_CONNECTIONS
            ) as client:
                warm = batch_file(WARM_UP_LINES, "warm-up")
                await run_batch(client, dsn, warm, ahead_file=None, body=body, rate=0, sample_s=1)
                for scenario in args.scenarios.split(","):
                    for lines in sizes:
                        ahead = None
                        if scenario == "busy":
                            ahead = batch_file(args.ahead_lines, f"ahead-{lines}")
                        measured = await run_batch(
                            client,
                            dsn,
                            batch_file(lines, f"{scenario}-{lines}"),
                            ahead_file=ahead,
                            body=body,
                            rate=args.interactive_rate,
                            sample_s=args.sample_s,
                            busy_for_s=args.busy_for,
                        )
                        results[f"{scenario}-{lines}"] = measured
                        print(f"{scenario}-{lines}: {json.dumps(measured)}", flush=True)

        asyncio.run(run())
    (args.out / "estimates.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n" + table(results))


def table(results: dict[str, Any]) -> str:
    rows = [
        "| batch | lines | took s | error at submission | at 10% | at 10%, of time left "
        "| largest from 10% | goal (25%) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:+.0%}"

    for name, r in results.items():
        if name == "engine":
            continue
        rows.append(
            f"| {name} | {r['lines']:,} | {r['seconds']:.0f} | {pct(r['error_at_submission'])} "
            f"| {pct(r['error_at_10pct'])} | {pct(r.get('error_at_10pct_of_time_left'))} "
            f"| {pct(r['max_abs_error_from_10pct'])} | {'met' if r['within_goal'] else 'missed'} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    main()
