"""Soak: single jobs through the whole pipeline (an engine that answers at once) for a long
run, with retention set to minutes, to show that the database levels off instead of
growing and that reads do not slow down as data comes and goes.

    python -m bench.soak [--jobs 1000000] [--retention-s 120] [--concurrency 256]

Reports the database's size and job rows over time, the longest statement any retention
pass ran (the longest it held a lock; goal under 100 ms, from maintenance's reports in
Redis), and `GET /v1/jobs/{id}` and `GET /v1/batches/{id}` latency (p50, p99; one request
at a time on an otherwise idle system) at the start and at the end (goal: the end's p99
within 1.2x of the start's). Writes `bench/results/soak.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psycopg
import redis

from bench import drive, stack, workload
from bench.peers import SERVED
from bench.stack import deployment
from inferq.constants import RETENTION_PASSES_KEY

# Jobs run before the first latency sample, so that it reads a table with rows in it.
WARM_UP_JOBS = 2000
# Jobs run just before the last latency sample, for it to read.
FRESH_JOBS = 200
# Reads per latency sample, one at a time.
READS = 500
# A year: the probe batch outlives the run.
PROBE_BATCH_KEEP_S = 365 * 86400


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--retention-s", type=int, default=120)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--sample-s", type=float, default=10)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    return parser.parse_args()


def _body(i: int) -> dict[str, Any]:
    return workload.body(workload.Request(f"s{i}", f"item {i}", 1), SERVED)


async def _drive(url: str, count: int, concurrency: int, recent: deque[str]) -> float:
    """`count` jobs, `concurrency` in flight, each to its end; jobs/s. Keeps the ids of the
    latest ones in `recent` (for reads of jobs that retention has not deleted)."""
    gate = asyncio.Semaphore(concurrency)

    async def one(client: aiohttp.ClientSession, i: int) -> None:
        async with gate:
            done = await drive.job(client, _body(i))
            recent.append(done["id"])

    started = time.perf_counter()
    async with drive.inferq_session(url, connections=concurrency) as client:
        # In slices: a million pending coroutines would cost more memory than the run.
        for start in range(0, count, 10 * concurrency):
            await asyncio.gather(
                *(one(client, i) for i in range(start, min(count, start + 10 * concurrency)))
            )
    return count / (time.perf_counter() - started)


def _latency(url: str, paths: list[str]) -> dict[str, float]:
    async def run() -> list[float]:
        seconds = []
        async with drive.inferq_session(url, connections=1) as client:
            for path in paths:
                started = time.perf_counter()
                await drive.read_json(await client.get(path))
                seconds.append(time.perf_counter() - started)
        return seconds

    seconds = asyncio.run(run())
    cuts = statistics.quantiles(seconds, n=100)
    return {"reads": len(seconds), "p50_ms": cuts[49] * 1000, "p99_ms": cuts[98] * 1000}


def _reads(url: str, recent: deque[str], batch_id: str) -> dict[str, dict[str, float]]:
    jobs = list(recent)[-100:]
    return {
        "job": _latency(url, [f"/v1/jobs/{jobs[i % len(jobs)]}" for i in range(READS)]),
        "batch": _latency(url, [f"/v1/batches/{batch_id}"] * READS),
    }


class Sampler(threading.Thread):
    """The database's size and job rows every `every_s` seconds."""

    def __init__(self, dsn: str, every_s: float) -> None:
        super().__init__(daemon=True)
        self._dsn = dsn
        self._every_s = every_s
        self._halt = threading.Event()
        self.samples: list[dict[str, float]] = []

    def run(self) -> None:
        started = time.monotonic()
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            while not self._halt.is_set():
                size, rows = conn.execute(
                    "SELECT pg_database_size(current_database()), (SELECT count(*) FROM jobs)"
                ).fetchone()  # type: ignore[misc]
                sample = {
                    "t_s": time.monotonic() - started,
                    "db_mb": size / 2**20,
                    "job_rows": rows,
                }
                self.samples.append(sample)
                # As it goes, so a long run shows its progress (and what it had, if cut off).
                print(json.dumps(sample), flush=True)
                self._halt.wait(self._every_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


AUTOVACUUM_OFF = (
    "autovacuum is off on this Postgres: the space of deleted rows is never reused, so the "
    "database grows whatever retention deletes (Postgres's default is on: "
    "ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf())"
)


def _autovacuum(dsn: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        setting = conn.execute("SHOW autovacuum").fetchone()
    on = setting is not None and setting[0] == "on"
    if not on:
        print(AUTOVACUUM_OFF, flush=True)
    return on


def _retention_passes(env: dict[str, str]) -> list[dict[str, Any]]:
    client = redis.Redis.from_url(env["INFERQ_REDIS_URL"])
    key = env["INFERQ_REDIS_KEY_PREFIX"] + RETENTION_PASSES_KEY
    return [json.loads(raw) for raw in client.lrange(key, 0, -1)]


def main() -> None:
    args = _parse()
    workdir = args.out / "work" / "soak"
    workdir.mkdir(parents=True, exist_ok=True)
    recent: deque[str] = deque(maxlen=1000)
    with deployment(
        stack.demo_model(),
        workdir,
        INFERQ_ENGINE="pipeline-only",
        INFERQ_ALLOW_BENCHMARK_ENGINE="true",
        INFERQ_MAX_NUM_SEQS="256",
        INFERQ_MAX_BATCH_SIZE="256",
        INFERQ_JOB_RETENTION_S=str(args.retention_s),
        INFERQ_MAINTENANCE_INTERVAL_S="5",
    ) as running:
        url, env = running.url, running.env
        client = openai.OpenAI(base_url=url + "/v1", api_key=stack.ADMIN_KEY, timeout=600)
        probe = workload.write_batch_file(
            [workload.Request(f"b{i}", f"item {i}", 1) for i in range(100)],
            SERVED,
            workdir / "probe.jsonl",
        )
        with probe.open("rb") as f:
            uploaded = client.files.create(file=f, purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint=workload.CHAT_URL,
            completion_window="24h",
            output_expires_after={"anchor": "created_at", "seconds": PROBE_BATCH_KEEP_S},
        )
        asyncio.run(_drive(url, WARM_UP_JOBS, args.concurrency, recent))
        start = _reads(url, recent, batch.id)
        dsn = env["INFERQ_DATABASE_URL"].replace("postgresql+psycopg://", "postgresql://")
        autovacuum = _autovacuum(dsn)
        sampler = Sampler(dsn, args.sample_s)
        sampler.start()
        jobs_per_s = asyncio.run(_drive(url, args.jobs, args.concurrency, recent))
        # Let retention catch up with the last jobs' window before the end's sample.
        time.sleep(min(args.retention_s, 30))
        sampler.stop()
        # Fresh jobs to read: the run's last ones may be gone already.
        asyncio.run(_drive(url, FRESH_JOBS, args.concurrency, recent))
        end = _reads(url, recent, batch.id)
        passes = _retention_passes(env)
    deleted: dict[str, int] = {}
    for report in passes:
        for kind, n in report["deleted"].items():
            deleted[kind] = deleted.get(kind, 0) + n
    result = {
        "jobs": args.jobs,
        "retention_s": args.retention_s,
        "autovacuum": autovacuum,
        "concurrency": args.concurrency,
        "jobs_per_s": jobs_per_s,
        "samples": sampler.samples,
        "retention": {
            "passes": len(passes),
            "deleted": deleted,
            "statements": sum(p["statements"] for p in passes),
            "longest_statement_ms": max((p["longest_statement_ms"] for p in passes), default=0),
        },
        "reads": {"start": start, "end": end},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(result, indent=2))
    _print(result)


def _print(result: dict[str, Any]) -> None:
    samples = result["samples"]
    jobs, rate, keep = result["jobs"], result["jobs_per_s"], result["retention_s"]
    print(f"{jobs} jobs at {rate:.0f} jobs/s, retention {keep} s")
    if not result["autovacuum"]:
        print(AUTOVACUUM_OFF)
    step = max(1, len(samples) // 12)
    for sample in samples[::step] + samples[-1:]:
        t, size, rows = sample["t_s"], sample["db_mb"], sample["job_rows"]
        print(f"  t={t:6.0f} s  db {size:8.1f} MB  job rows {rows:>9}")
    retention = result["retention"]
    longest = retention["longest_statement_ms"]
    print(
        f"retention: {retention['passes']} passes, {retention['statements']} statements, "
        f"deleted {retention['deleted']}, longest statement {longest:.1f} ms"
    )
    for kind in ("job", "batch"):
        start, end = result["reads"]["start"][kind], result["reads"]["end"][kind]
        print(
            f"GET {kind}: p50 {start['p50_ms']:.2f} -> {end['p50_ms']:.2f} ms, "
            f"p99 {start['p99_ms']:.2f} -> {end['p99_ms']:.2f} ms "
            f"({end['p99_ms'] / start['p99_ms']:.2f}x)"
        )


if __name__ == "__main__":
    main()
