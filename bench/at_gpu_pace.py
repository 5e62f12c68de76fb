"""The whole stack at a GPU's pace: the API, Redis, Postgres, the webhooks worker, beat and
`--workers` GPU workers, each with a paced engine (worker/engine/paced.py) that keeps an
H100's time (bench/gpu_pace/), on one Postgres and one Redis of the bench's own, each
workload held against the same engine's ideal (bench/pace.py) in the same run:
bench (the bench workload's 3,000 lines as a batch file), short (20,000 lines of about
100 prompt tokens and 4 output tokens), long (500 lines of 1,024 output tokens), jobs and
chats (the bench workload's requests as single jobs and chat completions, 256 in flight).

    python -m bench.at_gpu_pace                          # every workload, one worker
    python -m bench.at_gpu_pace --workers 4 --workloads bench,long --mean-step-ms 10
    python -m bench.at_gpu_pace --targets                # every setting the targets name

A file is timed from its lines queued (`POST /v1/batches` has answered) to the batch
completed, its ingest apart (the ideal leaves tokenizing out); online work from the first
request to the last answer (bench/pace_runs.py). `--mean-step-ms` scales the table so that
the bench workload's ideal steps average that long. The paced engine spends no GPU; the
CPU its calls take in the worker (the worker's `inferq_engine_cpu_seconds_total`) is the
engine's, and the figures beside the engine leave it out.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench import paced, stack, workload
from bench.pace import H100, Ideal, Line, file_ideal, online_ideal, scaled_to
from bench.pace_runs import (
    IN_FLIGHT,
    Statements,
    idle_cpu,
    measure,
    run_file,
    run_online,
)
from bench.pipeline import CpuMeter, ThreadMeter, profiled
from cli.demo_model import BENCH
from inferq.host.processes import descendants
from tests.helpers.servers import PostgresServer, RedisServer
from worker.engine.paced import StepTimes

WORKLOADS = ("bench", "short", "long", "jobs", "chats")
FILES = ("bench", "short", "long")
MAX_NUM_SEQS = 256
LONG_OUTPUT = 1024
IDLE_S = 10
RESULTS = Path(__file__).parent / "results"


class Setting(NamedTuple):
    """One deployment of the benchmark: its GPU workers, their pace (None: the table's
    own), and the workloads run on it."""

    workers: int
    mean_step_ms: float | None
    workloads: tuple[str, ...]

    @property
    def label(self) -> str:
        pace = "table" if self.mean_step_ms is None else f"{self.mean_step_ms:g}ms"
        return f"{self.workers}w@{pace}"


# What the targets name: every workload with one worker at the table's pace; the files at
# 25 ms and 10 ms a step with one worker and with four; `inferq run` at both paces.
TARGETS = (
    Setting(1, None, WORKLOADS),
    Setting(1, 25, ("bench", "long")),
    Setting(1, 10, ("bench", "long")),
    Setting(4, 25, ("bench", "long")),
    Setting(4, 10, ("bench", "long")),
)
RUN_PACES = (25.0, 10.0)


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
    """A Postgres and a Redis of the bench's own: their DSN and URL, and their processes
    (stopped at the end, on SIGTERM too)."""
    with ExitStack() as cleanup:
        cleanup.enter_context(stack.stopped_on_sigterm())
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


def _warm_up(deployment: stack.Deployment, tokenizer: Any, workdir: Path) -> None:
    """A small batch and a few jobs first: the figures are a running deployment's, not
    its first requests' (imports, connections, caches)."""
    requests = workload.bulk(tokenizer, 32, context=BENCH.max_position_embeddings, seed=1)
    path = workload.write_batch_file(requests, stack.MODEL_NAME, workdir / "warm.jsonl")
    run_file(deployment, path)
    run_online(deployment, "jobs", [workload.body(r, stack.MODEL_NAME) for r in requests])
    run_online(deployment, "chats", [workload.body(r, stack.MODEL_NAME) for r in requests])


def engine_cpu_s(deployment: stack.Deployment) -> float:
    """The CPU the workers' engines have spent so far (each worker's metric of it)."""
    total = 0.0
    for worker in deployment.workers:
        port = worker.env["INFERQ_WORKER_METRICS_PORT"]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            if family.name == "inferq_engine_cpu_seconds":
                total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


def _ideal_figures(ideal: Ideal, figures: dict[str, Any], engine_s: float) -> dict[str, Any]:
    ratios = {
        "ideal_seconds": round(ideal.seconds, 3),
        "ideal_steps": ideal.steps,
        "x_ideal": round(ideal.seconds / figures["seconds"], 4),
    }
    if "create_s" in figures:
        whole = figures["upload_s"] + figures["create_s"] + figures["seconds"]
        ratios["x_ideal_with_ingest"] = round(ideal.seconds / whole, 4)
    # The paced engine runs inside the worker's process, where a GPU's engine core would
    # not: the CPU its calls took there (`engine_s`, the workers' metric of it) is the
    # engine's, not the pipeline's. Its ideal's CPU on the same requests is what the same
    # code costs run back to back, with no wait between steps.
    count = figures.get("lines") or figures["requests"]
    engine_ms = 1000 * engine_s / count
    spent = figures.get("run_cpu_ms_per_line") or figures["cpu_ms_per_line"]
    ratios["paced_engine_cpu_ms_per_line"] = round(engine_ms, 3)
    ratios["ideal_engine_cpu_ms_per_line"] = round(1000 * ideal.cpu_s / count, 3)
    ratios["cpu_ms_per_line_beside_the_engine"] = round(spent["all"] - engine_ms, 3)
    return ratios


def run_setting(
    setting: Setting, args: argparse.Namespace, *, tokenizer: Any, times: StepTimes
) -> dict[str, Any]:
    """One deployment with `setting`'s workers at its pace, and its workloads' figures."""
    if setting.mean_step_ms is not None:
        times = scaled_to(
            times,
            bench_lines(tokenizer),
            max_num_seqs=MAX_NUM_SEQS,
            mean_step_ms=setting.mean_step_ms,
        )
    results: dict[str, Any] = {
        "workers": setting.workers,
        "mean_step_ms": setting.mean_step_ms,
        "workloads": {},
    }
    model = stack.demo_model(BENCH, "bench")  # the API's tokenizer; no weights are loaded
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
                model, workdir, workers=setting.workers, admin_dsn=dsn, redis_url=redis_url, **env
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
            print(setting.label, "idle", json.dumps(results["idle_cpu_s_per_s"]), flush=True)
            statements = Statements(running.env["INFERQ_DATABASE_URL"]) if args.statements else None
            spied = {"api": running.api.popen.pid}
            spied |= {f"worker{i}": w.popen.pid for i, w in enumerate(running.workers)}
            spied["housekeeping"] = running.service.popen.pid
            for name in setting.workloads:
                requests = requests_for(name, tokenizer, args.requests)
                if name in FILES:
                    path = workload.write_batch_file(
                        requests, stack.MODEL_NAME, workdir / f"{name}.jsonl"
                    )
                    go = functools.partial(run_file, running, path, meter)
                else:
                    bodies = [workload.body(r, stack.MODEL_NAME) for r in requests]
                    go = functools.partial(run_online, running, name, bodies)
                engine_before = engine_cpu_s(running)
                with profiled(spied, args.profile, f"{setting.label}-{name}"):
                    figures, lines = measure(
                        meter, go, threads=ThreadMeter(spied), statements=statements
                    )
                engine_s = engine_cpu_s(running) - engine_before
                if name in FILES:
                    ideal = file_ideal(
                        times, lines, max_num_seqs=MAX_NUM_SEQS, engines=setting.workers
                    )
                else:
                    ideal = online_ideal(
                        times, lines, max_num_seqs=MAX_NUM_SEQS, in_flight=IN_FLIGHT
                    )
                figures.update(_ideal_figures(ideal, figures, engine_s))
                results["workloads"][name] = figures
                print(setting.label, name, json.dumps(figures), flush=True)
    return results


@functools.cache
def _bench_lines(tokenizer: Any) -> tuple[Line, ...]:
    return tuple(
        Line(len(workload.chat_token_ids(tokenizer, r.prompt)), r.max_tokens)
        for r in workload.bulk(tokenizer, 3000, context=BENCH.max_position_embeddings)
    )


def bench_lines(tokenizer: Any) -> list[Line]:
    """The bench workload's lines, by their lengths: what a pace is scaled on."""
    return list(_bench_lines(tokenizer))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(stack.demo_model(BENCH, "bench"))
    times = StepTimes.load(args.table)
    plan = TARGETS if args.targets else (Setting(args.workers, args.mean_step_ms, args.workloads),)
    results: dict[str, Any] = {"commit": _commit(), "table": args.table.name, "settings": {}}
    for setting in plan:
        results["settings"][setting.label] = run_setting(
            setting, args, tokenizer=tokenizer, times=times
        )
    if args.targets:
        results["inferq_run"] = {
            f"{ms:g}ms": paced.run(
                3000, table=args.table, mean_step_ms=ms, max_num_seqs=MAX_NUM_SEQS
            )
            for ms in RUN_PACES
        }
        print("inferq run", json.dumps(results["inferq_run"]), flush=True)
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
    parser.add_argument(
        "--targets", action="store_true", help="every setting the targets name (TARGETS)"
    )
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
    name = "targets" if args.targets else f"{args.workers}w"
    out = args.out or RESULTS / f"gpu-pace-{results['commit']}-{name}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(out)


if __name__ == "__main__":
    main()
