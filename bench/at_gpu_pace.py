"""The whole stack at a GPU's pace: the API, Redis, Postgres, the webhooks worker, beat and
`--workers` GPU workers, each with a paced engine (worker/engine/paced.py) that keeps an
H100's time (bench/gpu_pace/), on one Postgres and one Redis of the bench's own. Each
workload is held against the same engine's ideal (bench/pace.py), in the same run:

- bench: the bench workload as a batch file (3,000 lines of long-tailed lengths);
- short: 20,000 lines of about 100 prompt tokens and 4 output tokens;
- long: 500 lines of 1,024 output tokens;
- jobs, chats: the bench workload's requests as single jobs (`POST /v1/jobs?wait=`) and
  as chat completions, 256 in flight.

A file is timed from the moment its lines are queued (`POST /v1/batches` has answered:
every line checked, tokenized and written) to the batch completed (its output file made),
against every line queued in the engines from the start; its ingest (upload and
`POST /v1/batches`) is timed apart, as the ideal's tokenizing is left out of it. Online
work is timed from the first request to the last answer, against the engine kept at 256
in flight. Each process's CPU (from /proc) is given per line or request.

    python -m bench.at_gpu_pace                          # every workload, one worker
    python -m bench.at_gpu_pace --workers 4 --workloads bench,long
    python -m bench.at_gpu_pace --mean-step-ms 10        # steps 2.5 times as short

The paced engine spends no GPU and almost no CPU: the figures are the pipeline's.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psycopg

from bench import drive, stack, workload
from bench.pace import H100, Ideal, Line, file_ideal, online_ideal, scaled_to
from bench.pipeline import CpuMeter, ThreadMeter, cpu_s, profiled
from cli.demo_model import BENCH
from inferq.host.processes import descendants
from tests.helpers.servers import PostgresServer, RedisServer
from worker.engine.paced import StepTimes

WORKLOADS = ("bench", "short", "long", "jobs", "chats")
FILES = ("bench", "short", "long")
MAX_NUM_SEQS = 256
IN_FLIGHT = 256
LONG_OUTPUT = 1024
POLL_S = 0.05
IDLE_S = 10
RESULTS = Path(__file__).parent / "results"


def requests_for(name: str, tokenizer: Any, count: int | None) -> list[workload.Request]:
    context = BENCH.max_position_embeddings
    if name in ("bench", "jobs", "chats"):
        return workload.bulk(tokenizer, count or 3000, context=context)
    if name == "short":
        return workload.fixed(tokenizer, count or 20_000, prompt_tokens=100, max_tokens=4)
    # Long outputs: the bench's prompts that leave room for 1,024 tokens.
    drawn = workload.bulk(tokenizer, 2 * (count or 500), context=context, seed=workload.SEED + 1)
    room = context - LONG_OUTPUT
    fitting = [r for r in drawn if len(workload.chat_token_ids(tokenizer, r.prompt)) <= room]
    return [
        workload.Request(f"r{i}", r.prompt, LONG_OUTPUT)
        for i, r in enumerate(fitting[: count or 500])
    ]


@contextmanager
def servers(workdir: Path) -> Iterator[tuple[str, str, Callable[[], list[int]]]]:
    """A Postgres and a Redis of the bench's own: their DSN and URL, and their processes."""
    with ExitStack() as cleanup:
        # Not under `workdir`: the server runs as `postgres` where the bench runs as root.
        pg_dir = Path(tempfile.mkdtemp(prefix="inferq-gpu-pace-pg-"))
        cleanup.callback(shutil.rmtree, pg_dir, ignore_errors=True)
        postgres = PostgresServer(pg_dir)
        postgres.start()
        # Each statement's time, for --statements: a restart loads the module.
        with psycopg.connect(postgres.dsn, autocommit=True) as connection:
            libraries = os.environ.get("BENCH_PG_LIBRARIES", "pg_stat_statements").split(",")
            listed = ", ".join(f"'{name.strip()}'" for name in libraries)
            connection.execute(f"ALTER SYSTEM SET shared_preload_libraries = {listed}")
        postgres.stop()
        postgres.start()
        # BENCH_PG_SETTINGS: `name = value; ...` for a look inside (auto_explain's, say).
        with psycopg.connect(postgres.dsn, autocommit=True) as connection:
            for setting in os.environ.get("BENCH_PG_SETTINGS", "").split(";"):
                if setting.strip():
                    connection.execute(f"ALTER SYSTEM SET {setting}")
            connection.execute("SELECT pg_reload_conf()")
        cleanup.callback(postgres.stop)
        if keep := os.environ.get("BENCH_PG_LOG"):
            cleanup.callback(shutil.copy, postgres.data / "server.log", keep)
        redis_server = RedisServer(workdir)
        redis_server.start()
        cleanup.callback(redis_server.kill)
        postmaster = int((postgres.data / "postmaster.pid").read_text().split()[0])
        assert redis_server.process is not None
        redis_pid = redis_server.process.pid

        def pids() -> list[int]:
            return [*descendants(postmaster), redis_pid]

        yield postgres.dsn, redis_server.url, pids


def run_file(
    deployment: stack.Deployment, path: Path, meter: CpuMeter | None = None
) -> tuple[dict[str, Any], list[Line]]:
    """The file through `/v1/batches`: its figures, and its lines' lengths as run. With
    `meter`: the CPU of its ingest (upload and `POST /v1/batches`) and of its run (from
    there to completed), apart. Its end is watched in Postgres, not through the API,
    whose answers to a poll every tenth of a second would cost it more than the batch."""
    url = deployment.url
    client = openai.OpenAI(base_url=url + "/v1", api_key=stack.ADMIN_KEY, timeout=3600)
    ingest = _Split(meter)
    started = time.perf_counter()
    with path.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    created_at = time.perf_counter()
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=workload.CHAT_URL, completion_window="24h"
    )
    queued_at = time.perf_counter()
    running = _Split(meter, after=ingest)
    database = deployment.env["INFERQ_DATABASE_URL"].replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(database, autocommit=True) as connection:
        while True:
            row = connection.execute("SELECT status FROM batches WHERE id = %s", (batch.id,))
            if row.fetchone() in (("completed",), ("failed",), ("expired",), ("cancelled",)):
                break
            time.sleep(POLL_S)
    ended_at = time.perf_counter()
    running.stop()
    with psycopg.connect(database, autocommit=True) as connection:
        first, last, finalizing, completed = connection.execute(
            "SELECT (SELECT extract(epoch FROM min(started_at)) FROM jobs WHERE batch_id = b.id), "
            "(SELECT extract(epoch FROM max(finished_at)) FROM jobs WHERE batch_id = b.id), "
            "extract(epoch FROM finalizing_at), extract(epoch FROM completed_at) "
            "FROM batches AS b WHERE id = %s",
            (batch.id,),
        ).fetchone()
    batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.output_file_id is not None
    content = client.files.content(batch.output_file_id).text
    outputs = [json.loads(x) for x in content.splitlines()]
    order = {f"r{i}": i for i in range(len(outputs))}
    outputs.sort(key=lambda line: order.get(line["custom_id"], 0))
    usage = [line["response"]["body"]["usage"] for line in outputs]
    lines = [Line(u["prompt_tokens"], u["completion_tokens"]) for u in usage]
    figures: dict[str, Any] = {
        "upload_s": created_at - started,
        "create_s": queued_at - created_at,
        "seconds": ended_at - queued_at,
        # From the lines queued to the first claimed; from the last line written to the
        # batch finalizing, and to its output made.
        "first_claim_s": round(float(first) - (time.time() - (time.perf_counter() - queued_at)), 3),
        "finalize_wait_s": round(float(finalizing) - float(last), 3),
        "finalize_s": round(float(completed) - float(finalizing), 3),
        "lines": len(lines),
        "output_tokens": sum(x.max_tokens for x in lines),
    }
    if meter is not None:
        figures["ingest_cpu_ms_per_line"] = _per_line(ingest.spent, len(lines))
        figures["run_cpu_ms_per_line"] = _per_line(running.spent, len(lines))
    return figures, lines


class _Split:
    """The CPU each of a meter's groups spends from now (or from where `after` stopped)
    until `stop`; without a meter, nothing."""

    def __init__(self, meter: CpuMeter | None, *, after: _Split | None = None) -> None:
        self._meter = meter
        self.spent: dict[str, float] = {}
        if meter is not None:
            if after is not None:
                after.stop()
            self._before = meter.read()

    def stop(self) -> None:
        if self._meter is not None and not self.spent:
            now = self._meter.read()
            self.spent = {
                group: sum(s - self._before[group].get(pid, 0.0) for pid, s in pids.items())
                for group, pids in now.items()
            }


def _per_line(cpu: dict[str, float], count: int) -> dict[str, float]:
    figures = {k: round(1000 * v / count, 3) for k, v in cpu.items()}
    figures["all"] = round(sum(figures.values()), 3)
    return figures


async def _one(
    client: aiohttp.ClientSession, kind: str, body: dict[str, Any]
) -> tuple[Line, dict[str, Any]]:
    """One request to its answer: its lengths, and when it was sent and answered."""
    sent = time.time()
    if kind == "jobs":
        done = await drive.job(client, body)
        if done["status"] != "succeeded":
            raise RuntimeError(f"job {done['id']} ended {done['status']}: {done.get('error')}")
    else:
        async with client.post("/v1/chat/completions", json=body) as response:
            done = await drive.read_json(response)
    usage = done["usage"]
    line = Line(usage["prompt_tokens"], usage["completion_tokens"])
    return line, {"id": done["id"], "sent": sent, "answered": time.time()}


def run_online(
    deployment: stack.Deployment, kind: str, bodies: list[dict[str, Any]]
) -> tuple[dict[str, Any], list[Line]]:
    """Every body as a single job or chat, `IN_FLIGHT` at a time, in order; with where
    a request's time went (its job's own timestamps between the client's)."""

    async def run() -> tuple[float, list[tuple[Line, dict[str, Any]]]]:
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(body: dict[str, Any]) -> tuple[Line, dict[str, Any]]:
            async with gate:
                return await _one(client, kind, body)

        async with drive.inferq_session(deployment.url, connections=IN_FLIGHT) as client:
            started = time.perf_counter()
            done = await asyncio.gather(*(one(b) for b in bodies))
            return time.perf_counter() - started, list(done)

    seconds, done = asyncio.run(run())
    lines = [line for line, _ in done]
    figures = {
        "seconds": seconds,
        "requests": len(lines),
        "output_tokens": sum(x.max_tokens for x in lines),
        "timeline_ms_p50_p90": timeline(deployment, [times for _, times in done]),
    }
    return figures, lines


def timeline(deployment: stack.Deployment, requests: list[dict[str, Any]]) -> dict[str, Any]:
    """Where single requests' time went, at the median and the 90th percentile: sent to
    written (`created_at`), to claimed (`started_at`), to ended (`finished_at`: its
    result committed), to answered."""
    database = deployment.env["INFERQ_DATABASE_URL"].replace("postgresql+psycopg", "postgresql")
    by_id = {"job_" + r["id"].removeprefix("chatcmpl-").removeprefix("job_"): r for r in requests}
    with psycopg.connect(database, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT id, extract(epoch FROM created_at), extract(epoch FROM started_at), "
            "extract(epoch FROM finished_at) FROM jobs WHERE id = ANY(%s)",
            (list(by_id),),
        ).fetchall()
    spans: dict[str, list[float]] = {"written": [], "claimed": [], "ended": [], "answered": []}
    for job_id, created, started, finished in rows:
        r = by_id[job_id]
        points = [r["sent"], float(created), float(started), float(finished), r["answered"]]
        for name, (a, b) in zip(spans, itertools.pairwise(points), strict=True):
            spans[name].append(1000 * (b - a))
    return {
        name: [round(statistics.median(v), 1), round(statistics.quantiles(v, n=10)[-1], 1)]
        for name, v in spans.items()
        if len(v) > 1
    }


def measure(
    meter: CpuMeter,
    run: Callable[[], tuple[dict[str, Any], list[Line]]],
    *,
    threads: ThreadMeter,
    statements: Statements | None,
) -> tuple[dict[str, Any], list[Line]]:
    """`run`'s figures with the CPU each group spent a line (the client: this process),
    and each named thread of the API and the workers; with `statements`, what Postgres
    spent on each statement."""
    client_before = cpu_s(os.getpid())
    if statements is not None:
        statements.reset()
    threads.start()
    meter.start()
    figures, lines = run()
    cpu = meter.stop()
    count = len(lines)
    figures["cpu_ms_per_line"] = _per_line(cpu, count)
    figures["client_cpu_ms_per_line"] = round(
        1000 * (cpu_s(os.getpid()) - client_before) / count, 3
    )
    figures["thread_cpu_ms_per_line"] = {
        process: {name: round(1000 * v / count, 3) for name, v in named.items() if v > 0}
        for process, named in threads.stop().items()
    }
    if statements is not None:
        figures["statements"] = statements.top(count)
    return figures, lines


class Statements:
    """What Postgres spends on each statement (pg_stat_statements), in one database."""

    TOP = 12

    def __init__(self, database_url: str) -> None:
        self._dsn = database_url.replace("postgresql+psycopg", "postgresql")
        with psycopg.connect(self._dsn, autocommit=True) as connection:
            connection.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")

    def reset(self) -> None:
        with psycopg.connect(self._dsn, autocommit=True) as connection:
            connection.execute("SELECT pg_stat_statements_reset()")

    def top(self, lines: int) -> list[dict[str, Any]]:
        """The statements that took the most time, per line or request."""
        with psycopg.connect(self._dsn, autocommit=True) as connection:
            rows = connection.execute(
                "SELECT calls, total_exec_time, rows, query FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "ORDER BY total_exec_time DESC LIMIT %s",
                (self.TOP,),
            ).fetchall()
        return [
            {
                "ms_per_line": round(total / lines, 4),
                "calls_per_line": round(calls / lines, 4),
                "rows": rows_,
                "query": " ".join(query.split())[:160],
            }
            for calls, total, rows_, query in rows
        ]


def idle_cpu(meter: CpuMeter, seconds: float) -> dict[str, float]:
    """What each group spends a second with no work (heartbeats, polls, timers)."""
    meter.start()
    time.sleep(seconds)
    return {k: round(v / seconds, 4) for k, v in meter.stop().items()}


def _warm_up(deployment: stack.Deployment, tokenizer: Any, workdir: Path) -> None:
    """A small batch and a few jobs first: the figures are a running deployment's, not
    its first requests' (imports, connections, caches)."""
    requests = workload.bulk(tokenizer, 32, context=BENCH.max_position_embeddings, seed=1)
    path = workload.write_batch_file(requests, stack.MODEL_NAME, workdir / "warm.jsonl")
    run_file(deployment, path)
    run_online(deployment, "jobs", [workload.body(r, stack.MODEL_NAME) for r in requests])
    run_online(deployment, "chats", [workload.body(r, stack.MODEL_NAME) for r in requests])


def _ideal_figures(ideal: Ideal, figures: dict[str, Any]) -> dict[str, Any]:
    ratios = {
        "ideal_seconds": round(ideal.seconds, 3),
        "ideal_steps": ideal.steps,
        "x_ideal": round(ideal.seconds / figures["seconds"], 4),
    }
    if "create_s" in figures:
        whole = figures["upload_s"] + figures["create_s"] + figures["seconds"]
        ratios["x_ideal_with_ingest"] = round(ideal.seconds / whole, 4)
    return ratios


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    model = stack.demo_model(BENCH, "bench")  # the API's tokenizer; no weights are loaded
    tokenizer = AutoTokenizer.from_pretrained(model)
    times = StepTimes.load(args.table)
    bench_lines = [
        Line(len(workload.chat_token_ids(tokenizer, r.prompt)), r.max_tokens)
        for r in workload.bulk(tokenizer, 3000, context=BENCH.max_position_embeddings)
    ]
    if args.mean_step_ms is not None:
        times = scaled_to(
            times, bench_lines, max_num_seqs=MAX_NUM_SEQS, mean_step_ms=args.mean_step_ms
        )
    results: dict[str, Any] = {
        "commit": _commit(),
        "workers": args.workers,
        "table": args.table.name,
        "mean_step_ms": args.mean_step_ms,
        "workloads": {},
    }
    with tempfile.TemporaryDirectory(prefix="inferq-gpu-pace-") as work:
        workdir = Path(work)
        table = workdir / "table.json"
        table.write_text(
            json.dumps(
                {
                    "tokens_ms": times.tokens_ms,
                    "context_ms_per_1k": times.context_ms_per_1k,
                    "max_num_batched_tokens": times.max_num_batched_tokens,
                    "async_scheduling": times.async_scheduling,
                }
            )
        )
        env = {
            "INFERQ_ENGINE": "paced",
            "INFERQ_ALLOW_BENCHMARK_ENGINE": "true",
            "INFERQ_PACED_ENGINE_TABLE": str(table),
            "INFERQ_MAX_MODEL_LEN": str(BENCH.max_position_embeddings),
            "INFERQ_MAX_NUM_SEQS": str(MAX_NUM_SEQS),
            "INFERQ_MAX_TOKENS_CAP": "4096",
            "TOKENIZERS_PARALLELISM": "false",
            **dict(item.split("=", 1) for item in args.env),
        }
        with (
            servers(workdir) as (dsn, redis_url, server_pids),
            stack.deployment(
                model, workdir, workers=args.workers, admin_dsn=dsn, redis_url=redis_url, **env
            ) as running,
        ):
            meter = CpuMeter(
                {
                    "api": lambda: descendants(running.api.popen.pid),
                    "workers": lambda: [
                        p for w in running.workers for p in descendants(w.popen.pid)
                    ],
                    "housekeeping": lambda: [
                        *descendants(running.service.popen.pid),
                        *descendants(running.beat.popen.pid),
                    ],
                    "postgres_redis": server_pids,
                }
            )
            _warm_up(running, tokenizer, workdir)
            results["idle_cpu_s_per_s"] = idle_cpu(meter, IDLE_S)
            print("idle", json.dumps(results["idle_cpu_s_per_s"]), flush=True)
            statements = Statements(running.env["INFERQ_DATABASE_URL"]) if args.statements else None
            spied = {"api": running.api.popen.pid}
            spied |= {f"worker{i}": w.popen.pid for i, w in enumerate(running.workers)}
            spied["housekeeping"] = running.service.popen.pid
            for name in args.workloads:
                requests = requests_for(name, tokenizer, args.requests)
                if name in FILES:
                    path = workload.write_batch_file(
                        requests, stack.MODEL_NAME, workdir / f"{name}.jsonl"
                    )
                    with profiled(spied, args.profile, name):
                        figures, lines = measure(
                            meter,
                            functools.partial(run_file, running, path, meter),
                            threads=ThreadMeter(spied),
                            statements=statements,
                        )
                    ideal = file_ideal(
                        times, lines, max_num_seqs=MAX_NUM_SEQS, engines=args.workers
                    )
                else:
                    bodies = [workload.body(r, stack.MODEL_NAME) for r in requests]
                    with profiled(spied, args.profile, name):
                        figures, lines = measure(
                            meter,
                            functools.partial(run_online, running, name, bodies),
                            threads=ThreadMeter(spied),
                            statements=statements,
                        )
                    ideal = online_ideal(
                        times, lines, max_num_seqs=MAX_NUM_SEQS, in_flight=IN_FLIGHT
                    )
                figures.update(_ideal_figures(ideal, figures))
                results["workloads"][name] = figures
                print(name, json.dumps(figures), flush=True)
    return results


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument(
        "--requests", type=int, help="lines or requests a workload (default: its own)"
    )
    parser.add_argument("--table", type=Path, default=H100)
    parser.add_argument("--mean-step-ms", type=float)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--env", action="append", default=[], help="NAME=VALUE for every process (repeatable)"
    )
    parser.add_argument(
        "--profile", type=Path, help="record the API and workers with py-spy into this folder"
    )
    parser.add_argument(
        "--statements", action="store_true", help="what Postgres spends on each statement"
    )
    args = parser.parse_args()
    args.workloads = [w for w in args.workloads.split(",") if w]
    unknown = set(args.workloads) - set(WORKLOADS)
    if unknown:
        parser.error(f"unknown workloads {sorted(unknown)}: choose from {', '.join(WORKLOADS)}")
    random.seed(workload.SEED)
    results = run(args)
    out = args.out or RESULTS / f"gpu-pace-{results['commit']}-w{args.workers}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
