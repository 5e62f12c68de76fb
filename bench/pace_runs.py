"""The GPU-pace benchmark's workloads through a running deployment, and what they cost:
a batch file from upload to completed (its ingest and its run apart), single jobs or chats
with a fixed number in flight (where each request's time went, from its job's own
timestamps), each process's CPU and, with `Statements`, Postgres's own account of each
statement. bench/at_gpu_pace.py runs them."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import psycopg

from bench import drive, stack, workload
from bench.pace import Line
from bench.pipeline import CpuMeter, ThreadMeter, cpu_s

IN_FLIGHT = 256
# The batch's end is timed by its own clock; each look costs Postgres, and counts in its CPU.
POLL_S = 0.25


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
    queued_epoch = time.time()
    running = _Split(meter, after=ingest)
    database = deployment.env["INFERQ_DATABASE_URL"].replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(database, autocommit=True) as connection:
        while True:
            row = connection.execute("SELECT status FROM batches WHERE id = %s", (batch.id,))
            if row.fetchone() in (("completed",), ("failed",), ("expired",), ("cancelled",)):
                break
            time.sleep(POLL_S)
    running.stop()
    with psycopg.connect(database, autocommit=True) as connection:
        first, last, finalizing, completed = connection.execute(
            "SELECT (SELECT extract(epoch FROM min(started_at)) FROM jobs WHERE batch_id = b.id), "
            "(SELECT extract(epoch FROM max(finished_at)) FROM jobs WHERE batch_id = b.id), "
            "extract(epoch FROM finalizing_at), extract(epoch FROM completed_at) "
            "FROM batches AS b WHERE id = %s",
            (batch.id,),
        ).fetchone()
        # Each worker's share: its lines, and its first claim and last end from queued.
        shares = connection.execute(
            "SELECT worker, count(*), extract(epoch FROM min(started_at)), "
            "extract(epoch FROM max(finished_at)) FROM jobs WHERE batch_id = %s "
            "GROUP BY worker ORDER BY worker",
            (batch.id,),
        ).fetchall()
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
        # To the batch completed, by its own clock: not when a poll saw it.
        "seconds": float(completed) - queued_epoch,
        # From the lines queued to the first claimed; from the last line written to the
        # batch finalizing, and to its output made.
        "first_claim_s": round(float(first) - queued_epoch, 3),
        "finalize_wait_s": round(float(finalizing) - float(last), 3),
        "finalize_s": round(float(completed) - float(finalizing), 3),
        "lines": len(lines),
        "output_tokens": sum(x.max_tokens for x in lines),
        "by_worker": {
            worker: {
                "lines": count,
                "first_claim_s": round(float(claimed) - queued_epoch, 3),
                "last_end_s": round(float(ended) - queued_epoch, 3),
            }
            for worker, count, claimed, ended in shares
        },
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
                "SELECT calls, total_exec_time, rows, query, plans, total_plan_time "
                "FROM pg_stat_statements "
                "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                "ORDER BY total_exec_time + total_plan_time DESC LIMIT %s",
                (self.TOP,),
            ).fetchall()
        return [
            {
                "ms_per_line": round(total / lines, 4),
                "calls_per_line": round(calls / lines, 4),
                "rows": rows_,
                # Planning, counted only with pg_stat_statements.track_planning on
                # (BENCH_PG_SETTINGS="pg_stat_statements.track_planning = on").
                "plan_ms_per_line": round(plan_total / lines, 4),
                "plans_per_line": round(plans / lines, 4),
                "query": " ".join(query.split())[:160],
            }
            for calls, total, rows_, query, plans, plan_total in rows
        ]


def idle_cpu(meter: CpuMeter, seconds: float) -> dict[str, float]:
    """What each group spends a second with no work (heartbeats, polls, timers)."""
    meter.start()
    time.sleep(seconds)
    return {k: round(v / seconds, 4) for k, v in meter.stop().items()}
