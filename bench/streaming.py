"""Online chat completions, streamed and not: inferq's `/v1/chat/completions` against
`vllm serve` on the same prompts and engine settings, in one run.

    python -m bench.streaming                      # everything
    python -m bench.streaming --skip beside --out bench/results

Steps, each system in processes of its own, one after the other:
- serve-stream-C, inferq-stream-C (C = 1, 16, 64): streamed requests, C in flight: time
  to first token (TTFT) and the time per output token after it (TPOT: from the first
  token to the last, over the tokens between), p50 and p99 over requests, and the gaps
  between chunks (p50);
- serve-chat-64, inferq-chat-64: non-streamed requests, 64 in flight: tokens/s;
- beside: a big batch through inferq, its generated tokens/s alone, then with single
  chat completions arriving as a Poisson process, first not streamed, then streamed:
  what streaming itself costs the batch.
Prints the targets' ratios; writes `streaming.json` to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench import drive, priority, stack, workload
from bench.compare import engine_args, inferq, inferq_env
from bench.peers import SERVED, serve, throughput
from cli.demo_model import BENCH

CONCURRENCIES = (1, 16, 64)
# Streamed requests at each concurrency: enough for a stable p50 in a short run.
STREAM_REQUESTS = {1: 40, 16: 320, 64: 640}


async def streamed(client: aiohttp.ClientSession, body: dict[str, Any]) -> dict[str, Any]:
    """One streamed chat completion: when each chunk of output came, and its usage."""
    started = time.perf_counter()
    stamps: list[float] = []
    usage = None
    request = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with client.post("/v1/chat/completions", json=request) as response:
        if response.status >= 400:
            raise RuntimeError(f"{response.status}: {(await response.text())[:500]}")
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            # Every chunk of output counts, the finishing one too (a random model may make
            # tokens that decode to nothing until the end), but not the role chunk.
            if any("role" not in c.get("delta", {}) for c in chunk["choices"]):
                stamps.append(time.perf_counter())
    ended = time.perf_counter()
    if not stamps or usage is None:
        raise RuntimeError(f"a stream ended without output ({len(stamps)}) or usage ({usage})")
    tokens = int(usage["completion_tokens"])
    return {
        "ttft_s": stamps[0] - started,
        # From the last output to the end of the stream (the usage chunk, `[DONE]`).
        "tail_s": ended - stamps[-1],
        "tpot_s": (stamps[-1] - stamps[0]) / (tokens - 1) if tokens > 1 else None,
        "gaps_s": [b - a for a, b in itertools.pairwise(stamps)],
        "tokens": tokens,
    }


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def stream_figures(
    base_url: str, bodies: list[dict[str, Any]], *, concurrency: int, api_key: str | None
) -> dict[str, Any]:
    """`len(bodies)` streamed requests, `concurrency` in flight: latency figures."""

    async def run() -> list[dict[str, Any]]:
        gate = asyncio.Semaphore(concurrency)
        async with drive.session(base_url, connections=concurrency, api_key=api_key) as client:

            async def one(body: dict[str, Any]) -> dict[str, Any]:
                async with gate:
                    return await streamed(client, body)

            return await asyncio.gather(*(one(b) for b in bodies))

    started = time.perf_counter()
    runs = asyncio.run(run())
    seconds = time.perf_counter() - started
    ttft = [r["ttft_s"] for r in runs]
    tpot = [r["tpot_s"] for r in runs if r["tpot_s"] is not None]
    gaps = [g for r in runs for g in r["gaps_s"]]
    return {
        **throughput(seconds, sum(r["tokens"] for r in runs), len(runs), concurrency=concurrency),
        "ttft_p50_s": statistics.median(ttft),
        "ttft_p99_s": _p(ttft, 99),
        "tpot_p50_s": statistics.median(tpot),
        "tpot_p99_s": _p(tpot, 99),
        "chunk_gap_p50_s": statistics.median(gaps),
        "tail_p50_s": statistics.median(r["tail_s"] for r in runs),
        "tail_p99_s": _p([r["tail_s"] for r in runs], 99),
    }


def chat_figures(
    base_url: str, bodies: list[dict[str, Any]], *, concurrency: int, api_key: str | None
) -> dict[str, Any]:
    """Non-streamed chat completions, `concurrency` in flight: throughput figures."""

    async def run() -> dict[str, Any]:
        async with drive.session(base_url, connections=concurrency, api_key=api_key) as client:
            return await drive.closed_loop(client, drive.chat_tokens, bodies, concurrency)

    return asyncio.run(run())


async def _arrivals(
    client: aiohttp.ClientSession,
    bodies: list[dict[str, Any]],
    *,
    stream: bool,
    rate_per_s: float,
    window_s: float,
) -> int:
    """Chat completions arriving as a Poisson process for `window_s`; waits for them all."""
    rng = random.Random(workload.SEED)
    call = streamed if stream else drive.chat_tokens
    tasks = []
    started = time.perf_counter()
    while time.perf_counter() - started < window_s:
        tasks.append(asyncio.create_task(call(client, bodies[len(tasks) % len(bodies)])))
        await asyncio.sleep(rng.expovariate(rate_per_s))
    await asyncio.gather(*tasks)
    return len(tasks)


def beside(
    base_url: str,
    *,
    batch_file: Path,
    bodies: list[dict[str, Any]],
    window_s: float,
    rate_per_s: float,
    max_num_seqs: int,
) -> dict[str, Any]:
    """A batch's tokens/s alone, beside unstreamed and beside streamed chat completions."""

    async def run() -> dict[str, Any]:
        async with drive.inferq_session(
            base_url, connections=drive.OPEN_LOOP_CONNECTIONS
        ) as client:
            batch_id = await priority.submit(client, batch_file)
            await priority.wait_until_completing(client, batch_id)
            marks = [await priority.progress(client, batch_id)]
            await asyncio.sleep(window_s)
            marks.append(await priority.progress(client, batch_id))
            counts = []
            for stream in (False, True):
                counts.append(
                    await _arrivals(
                        client, bodies, stream=stream, rate_per_s=rate_per_s, window_s=window_s
                    )
                )
                marks.append(await priority.progress(client, batch_id))
            await priority.cancel(client, batch_id)
        windows = [
            b.rates_since(a, max_num_seqs=max_num_seqs) for a, b in itertools.pairwise(marks)
        ]
        alone, plain, streaming = windows
        return {
            "window_s": window_s,
            "rate_per_s": rate_per_s,
            "requests": {"unstreamed": counts[0], "streamed": counts[1]},
            "batch_alone": alone,
            "batch_beside_unstreamed": plain,
            "batch_beside_streamed": streaming,
            "streamed_x_unstreamed": streaming["tokens_per_s"] / plain["tokens_per_s"],
        }

    return asyncio.run(run())


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="non-streamed requests")
    parser.add_argument("--model", type=Path, default=None, help="default: the bench model")
    parser.add_argument("--gpu", action="store_true", help="the reference GPU settings")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--skip", default="", help="comma-separated step names to leave out")
    parser.add_argument("--beside-lines", type=int, default=20_000)
    parser.add_argument("--beside-window", type=float, default=40.0)
    parser.add_argument("--beside-rate", type=float, default=2.0)
    return parser.parse_args()


def _systems(
    results: dict[str, Any],
    *,
    url: str,
    name: str,
    api_key: str | None,
    bodies: list[dict[str, Any]],
    skip: set[str],
) -> None:
    for concurrency in CONCURRENCIES:
        step = f"{name}-stream-{concurrency}"
        if step not in skip:
            subset = bodies[: STREAM_REQUESTS[concurrency]]
            results[step] = stream_figures(url, subset, concurrency=concurrency, api_key=api_key)
            print(step, json.dumps(results[step]), flush=True)
    step = f"{name}-chat-64"
    if step not in skip:
        results[step] = chat_figures(url, bodies, concurrency=64, api_key=api_key)
        print(step, json.dumps(results[step]), flush=True)


def targets(results: dict[str, Any]) -> list[str]:
    """The issue's targets, each with its figure."""
    lines = []
    for c in CONCURRENCIES:
        ours, theirs = results.get(f"inferq-stream-{c}"), results.get(f"serve-stream-{c}")
        if ours and theirs:
            extra_ms = (ours["ttft_p50_s"] - theirs["ttft_p50_s"]) * 1000
            tpot = ours["tpot_p50_s"] / theirs["tpot_p50_s"]
            lines.append(
                f"concurrency {c}: TTFT p50 {ours['ttft_p50_s'] * 1000:.0f} ms vs "
                f"{theirs['ttft_p50_s'] * 1000:.0f} ms (+{extra_ms:.0f} ms; target +25), "
                f"TPOT p50 {ours['tpot_p50_s'] * 1000:.1f} vs {theirs['tpot_p50_s'] * 1000:.1f} "
                f"ms ({tpot:.3f}x; target 1.1x)"
            )
    ours, theirs = results.get("inferq-chat-64"), results.get("serve-chat-64")
    if ours and theirs:
        ratio = ours["tokens_per_s"] / theirs["tokens_per_s"]
        lines.append(
            f"non-streamed at 64: {ours['tokens_per_s']:.0f} vs {theirs['tokens_per_s']:.0f} "
            f"tok/s ({ratio:.3f}x; target 0.95x)"
        )
    if "beside" in results:
        lines.append(
            f"batch beside streamed / beside unstreamed: "
            f"{results['beside']['streamed_x_unstreamed']:.3f}x (target 0.95x)"
        )
    return lines


def main() -> None:
    args = _parse()
    skip = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    model = args.model or stack.demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=args.gpu)
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests = workload.bulk(tokenizer, args.requests, context=engine["max_model_len"])
    bodies = [workload.body(r, SERVED) for r in requests]
    workdir = args.out / "work-streaming"
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    if not {"serve-stream-1", "serve-stream-16", "serve-stream-64", "serve-chat-64"} <= skip:
        with serve(engine, workdir) as url:
            _systems(results, url=url, name="serve", api_key=None, bodies=bodies, skip=skip)
    with inferq(model, workdir, **inferq_env(engine)) as url:
        _systems(results, url=url, name="inferq", api_key=stack.ADMIN_KEY, bodies=bodies, skip=skip)
        if "beside" not in skip:
            lines = workload.bulk(
                tokenizer,
                args.beside_lines,
                context=engine["max_model_len"],
                seed=workload.SEED + 2,
            )
            batch_file = workload.write_batch_file(lines, SERVED, workdir / "beside.jsonl")
            results["beside"] = beside(
                url,
                batch_file=batch_file,
                bodies=bodies,
                window_s=args.beside_window,
                rate_per_s=args.beside_rate,
                max_num_seqs=int(engine["max_num_seqs"]),
            )
    (args.out / "streaming.json").write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(["", *targets(results)]))


if __name__ == "__main__":
    main()
