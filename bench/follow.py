"""What following a batch live costs: the batch's tokens/s with and without followers, and
the API's CPU per follower.

    python -m bench.follow                          # 20,000 lines, 10 followers
    python -m bench.follow --lines 2000 --followers 10 --rounds 1
    python -m bench.follow --no-closing             # without the last batch alone

One deployment on the real engine (the bench model and engine settings of bench.compare).
A batch of `--lines` lines of the bench workload runs without followers, then the same
lines (each batch's prompts with a prefix of its own, out of the prefix cache) with
`--followers` clients following its output from its creation
(`GET /v1/batches/{id}/output?follow=true&include=errors`, every event read and checked:
each line once, in order), and so on for `--rounds` rounds; a last batch without
followers closes the run, so each followed batch lies between two that were not. Each
batch's rate is its output tokens over the time from its creation to its last line's end
(from Postgres); CPU is read from /proc for the API process, the GPU worker (its own
threads and the engine's processes) and Postgres over each batch. The goal: the followed
batches at 0.97x or better of the others.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

from bench import drive, priority, workload
from bench.compare import engine_args, inferq_env
from bench.peers import SERVED
from bench.pipeline import CpuMeter, by_name
from bench.stack import ADMIN_KEY, demo_model, deployment
from cli.demo_model import BENCH
from inferq.host.processes import descendants

GOAL = 0.97


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--followers", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--closing",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a batch without followers after the last followed one (--no-closing: on a "
        "slow machine, a 20,000-line batch less)",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    return parser.parse_args()


async def follow(base_url: str, batch_id: str, lines: int) -> int:
    """Follow the batch's output to its end; the lines received (each once, in order).
    Events are split out of whole chunks, not read line by line: the client shares the
    two cores with what it measures, and aiohttp's `readline` over a large chunk costs far
    more than inferq's side of the event."""
    timeout = aiohttp.ClientTimeout(total=None, sock_read=300)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    received = 0
    pending = b""
    async with (
        aiohttp.ClientSession(base_url, headers=headers, timeout=timeout) as session,
        session.get(
            f"/v1/batches/{batch_id}/output", params={"follow": "true", "include": "errors"}
        ) as response,
    ):
        response.raise_for_status()
        async for chunk in response.content.iter_any():
            *events, pending = (pending + chunk.replace(b"\r\n", b"\n")).split(b"\n\n")
            for event in events:
                fields = dict(line.split(b": ", 1) for line in event.split(b"\n") if b": " in line)
                kind = fields.get(b"event")
                if kind == b"line":
                    received += 1
                    if int(fields[b"id"]) != received:
                        raise RuntimeError(f"line {fields[b'id']!r} came where {received} was due")
                elif kind == b"end":
                    pending = b""
                    break
            else:
                continue
            break
    if received != lines:
        raise RuntimeError(f"{received} of {lines} lines came")
    return received


def _rate(dsn: str, batch_id: str) -> dict[str, float]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM max(j.finished_at) - b.created_at), b.output_tokens "
            "FROM batches b JOIN jobs j ON j.batch_id = b.id WHERE b.id = %s GROUP BY b.id",
            (batch_id,),
        ).fetchone()
    assert row is not None
    seconds, tokens = float(row[0]), int(row[1])
    return {"seconds": seconds, "output_tokens": tokens, "tokens_per_s": tokens / seconds}


async def run_batch(
    client: aiohttp.ClientSession,
    base_url: str,
    dsn: str,
    batch_file: Path,
    *,
    lines: int,
    followers: int,
    meter: CpuMeter,
) -> dict[str, Any]:
    meter.start()
    batch_id = await priority.submit(client, batch_file)
    following = [asyncio.create_task(follow(base_url, batch_id, lines)) for _ in range(followers)]
    while (await priority.progress(client, batch_id)).status not in priority.ENDED:
        await asyncio.sleep(1)
    await asyncio.gather(*following)
    cpu = meter.stop()
    return {"followers": followers, **await asyncio.to_thread(_rate, dsn, batch_id), "cpu_s": cpu}


def main() -> None:
    args = _parse()
    from transformers import AutoTokenizer

    model = demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=False)
    tokenizer = AutoTokenizer.from_pretrained(model)
    workdir = args.out / "work" / "follow"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    plan = [0, *[n for _ in range(args.rounds) for n in (args.followers, 0)]]
    if not args.closing:
        plan.pop()
    requests = workload.bulk(
        tokenizer, args.lines, context=engine["max_model_len"], seed=workload.SEED + 200
    )
    runs: list[dict[str, Any]] = []
    with deployment(model, workdir, **inferq_env(engine)) as running:
        dsn = running.env["INFERQ_DATABASE_URL"].replace("+psycopg", "")
        meter = CpuMeter(
            {
                "api": lambda: descendants(running.api.popen.pid),
                "worker": lambda: descendants(running.worker.popen.pid),
                "postgres": lambda: by_name("postgres"),
                # The followers run here, on the same two cores.
                "client": lambda: [os.getpid()],
            }
        )

        async def run() -> None:
            async with drive.inferq_session(running.url, connections=4) as client:
                for number, followers in enumerate(plan):
                    # The same lengths every time; a prefix of its own keeps each batch out
                    # of the engine's prefix cache.
                    own = [
                        dataclasses.replace(r, prompt=f"Batch {number}. {r.prompt}")
                        for r in requests
                    ]
                    path = workload.write_batch_file(own, SERVED, workdir / f"{number}.jsonl")
                    measured = await run_batch(
                        client,
                        running.url,
                        dsn,
                        path,
                        lines=args.lines,
                        followers=followers,
                        meter=meter,
                    )
                    runs.append(measured)
                    print(json.dumps(measured), flush=True)

        asyncio.run(run())
    results = {"lines": args.lines, "runs": runs, **summary(runs, args.followers)}
    (args.out / "follow.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "runs"}, indent=2))


def summary(runs: list[dict[str, Any]], followers: int) -> dict[str, Any]:
    alone = [r for r in runs if r["followers"] == 0]
    followed = [r for r in runs if r["followers"] > 0]
    rate_alone = statistics.mean(r["tokens_per_s"] for r in alone)
    rate_followed = statistics.mean(r["tokens_per_s"] for r in followed)
    api_alone = statistics.mean(r["cpu_s"]["api"] for r in alone)
    api_followed = statistics.mean(r["cpu_s"]["api"] for r in followed)
    seconds = statistics.mean(r["seconds"] for r in followed)
    per_follower_s = (api_followed - api_alone) / followers
    return {
        "tokens_per_s_alone": rate_alone,
        "tokens_per_s_followed": rate_followed,
        "followed_x_alone": rate_followed / rate_alone,
        "goal_met": rate_followed / rate_alone >= GOAL,
        "api_cpu_s_alone": api_alone,
        "api_cpu_s_followed": api_followed,
        "api_cpu_s_per_follower": per_follower_s,
        "api_cores_per_follower": per_follower_s / seconds,
    }


if __name__ == "__main__":
    main()
