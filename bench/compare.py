"""inferq side by side with vLLM, on the same prompts and engine settings, in one run.

    python -m bench.compare                       # everything
    python -m bench.compare --requests 500 --skip serve,serve-256,run-batch

Systems, each in processes of its own, one after another:
- engine: every prompt through one `LLM.generate` call (the limit);
- inferq-run: `inferq run` on the same file in OpenAI Batch format (SQLite, no services);
- run-batch: `vllm run-batch` on that file;
- serve, serve-256: vLLM's OpenAI server (one process), at concurrency 64 and 256;
- inferq-batch: the file through `POST /v1/batches` until its output file is read;
- inferq-jobs-64, inferq-jobs: the same prompts as single `POST /v1/jobs` submissions, at
  concurrency 64 and 256 (single requests to both systems go through `bench.drive`);
- idle: one job at a time on an otherwise idle system;
- interactive: single jobs on Poisson arrivals at several rates (latency against load);
- priority: interactive jobs while a big batch saturates the engine (`bench.priority`);
- pipeline: inferq with the pipeline-only engine (no model): jobs/s through API, Redis, worker
  and Postgres, for batch lines and for single jobs.
inferq-run and run-batch are timed over their processing: their wall time less their
engine's load (which each notes). Every step's name works with --skip. Prints a table of
tokens/s with ratios to the engine limit, and writes the figures (JSON, after each step)
and a chart (PNG) to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Literal

import openai

from bench import drive, stack, workload
from bench.local_run import run_inferq_local
from bench.peers import SERVED, run_engine, run_run_batch, serve, throughput
from bench.priority import run_priority
from bench.report import CONCURRENCIES, chart, single_key, table
from cli.demo_model import BENCH, CPU_DTYPE
from inferq.host.kv_cache import ModelShape, sequence_bytes

MAX_NUM_SEQS = 64
IDLE_JOBS = 50
PIPELINE_SINGLE_JOBS = 5000
PIPELINE_CONCURRENCY = 256
STEPS = (
    "engine",
    "inferq-run",
    "run-batch",
    *(single_key("serve", c) for c in CONCURRENCIES),
    "inferq-batch",
    *(single_key("inferq-jobs", c) for c in CONCURRENCIES),
    "idle",
    "interactive",
    "priority",
    "pipeline",
)


def engine_args(model: Path, *, gpu: bool) -> dict[str, Any]:
    """The engine settings every system gets."""
    if gpu:  # the reference deployment: an 8B INT4 model on one GPU
        return {
            "model": str(model),
            "served_model_name": SERVED,
            "max_model_len": 8192,
            "max_num_seqs": 256,
            "gpu_memory_utilization": 0.9,
            "seed": 0,
        }
    return {
        "model": str(model),
        "served_model_name": SERVED,
        "max_model_len": BENCH.max_position_embeddings,
        "max_num_seqs": MAX_NUM_SEQS,
        # Room for every sequence at full length, the same for every system, whatever the
        # host's memory layout (what inferq's own CPU sizing gives this model).
        "kv_cache_memory_bytes": MAX_NUM_SEQS
        * sequence_bytes(_bench_shape(), BENCH.max_position_embeddings),
        "enforce_eager": True,
        "dtype": CPU_DTYPE,
        "seed": 0,
    }


def _bench_shape() -> ModelShape:
    return ModelShape(
        num_layers=BENCH.num_hidden_layers,
        num_kv_heads=BENCH.num_key_value_heads,
        head_dim=BENCH.hidden_size // BENCH.num_attention_heads,
        context_len=BENCH.max_position_embeddings,
        kv_dtype_bytes=4,  # CPU_DTYPE, float32
        weights_bytes=None,
    )


def inferq_env(args: dict[str, Any]) -> dict[str, str]:
    memory = {
        f"INFERQ_{key.upper()}": str(args[key])
        for key in ("gpu_memory_utilization", "kv_cache_memory_bytes")
        if key in args
    }
    return {
        **memory,
        "INFERQ_MAX_MODEL_LEN": str(args["max_model_len"]),
        "INFERQ_MAX_NUM_SEQS": str(args["max_num_seqs"]),
        "INFERQ_ENFORCE_EAGER": str(args.get("enforce_eager", False)).lower(),
        "INFERQ_DTYPE": str(args.get("dtype", "auto")),
        "INFERQ_ENGINE_SEED": str(args["seed"]),
        "INFERQ_MAX_TOKENS_CAP": "4096",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
    }


@contextmanager
def inferq(model: Path, workdir: Path, **extra: str) -> Iterator[str]:
    """API, GPU worker, delivery/maintenance worker and beat on a database of their own;
    the API's URL."""
    with stack.deployment(model, workdir, **extra) as running:
        yield running.url


def run_inferq_batch(
    base_url: str,
    batch_file: Path,
    *,
    keep_outputs: bool = False,
    endpoint: Literal["/v1/chat/completions", "/v1/embeddings"] = workload.CHAT_URL,
    usage_field: str = "completion_tokens",
) -> dict[str, Any]:
    """The file through `POST /v1/batches` until its output is read; its tokens are each
    output's `usage[usage_field]`."""
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=stack.ADMIN_KEY, timeout=3600)
    started = time.perf_counter()
    with batch_file.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=endpoint, completion_window="24h"
    )
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.25)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.output_file_id is not None
    content = client.files.content(batch.output_file_id).text
    seconds = time.perf_counter() - started
    lines = [json.loads(line) for line in content.splitlines()]
    tokens = sum(line["response"]["body"]["usage"][usage_field] for line in lines)
    extra = {"outputs": lines} if keep_outputs else {}
    return throughput(seconds, tokens, len(lines), **extra)


def run_idle(base_url: str, body: dict[str, Any], count: int) -> dict[str, Any]:
    """One job at a time on an otherwise idle system: submission to result."""
    latencies = drive.one_at_a_time(base_url, body, count)
    return {"jobs": count, **drive.percentiles(latencies), "max_s": max(latencies)}


def run_interactive(
    base_url: str, body: dict[str, Any], rates: list[float], duration_s: float
) -> list[dict[str, Any]]:
    """Single jobs arriving as a Poisson process at each rate: time to result."""
    rng = random.Random(workload.SEED)
    points = []
    for rate in rates:
        latencies = drive.poisson(base_url, body, rate_per_s=rate, duration_s=duration_s, rng=rng)
        cuts = statistics.quantiles(latencies, n=100)
        points.append(
            {
                "rate": rate,
                "jobs": len(latencies),
                "p50_s": statistics.median(latencies),
                "p95_s": cuts[94],
                "p99_s": cuts[98],
            }
        )
    return points


def run_pipeline(workdir: Path, lines: int) -> dict[str, Any]:
    """jobs/s through inferq with an engine that answers at once (no model)."""
    workdir = workdir / "pipeline"  # its own logs: the real-engine deployment's stay
    workdir.mkdir(exist_ok=True)
    model = stack.demo_model()  # only its tokenizer is used
    requests = [workload.Request(f"p{i}", f"item {i}", 1) for i in range(lines)]
    batch_file = workload.write_batch_file(requests, SERVED, workdir / "pipeline.jsonl")
    with inferq(
        model,
        workdir,
        INFERQ_ENGINE="pipeline-only",
        INFERQ_ALLOW_BENCHMARK_ENGINE="true",
        INFERQ_MAX_NUM_SEQS="256",
        INFERQ_MAX_BATCH_SIZE="256",
    ) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key=stack.ADMIN_KEY, timeout=3600)
        with batch_file.open("rb") as f:
            uploaded = client.files.create(file=f, purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id, endpoint=workload.CHAT_URL, completion_window="24h"
        )
        queued = time.perf_counter()
        while batch.status not in ("completed", "failed"):
            time.sleep(0.1)
            batch = client.batches.retrieve(batch.id)
        batch_jobs_per_s = lines / (time.perf_counter() - queued)
        single = drive.inferq_jobs(
            url,
            [workload.body(r, SERVED) for r in requests[:PIPELINE_SINGLE_JOBS]],
            concurrency=PIPELINE_CONCURRENCY,
        )
    return {
        "batch_lines": lines,
        "batch_jobs_per_s": batch_jobs_per_s,
        "single_jobs": single["requests"],
        "single_jobs_per_s": single["requests_per_s"],
        "single_concurrency": single["concurrency"],
    }


class Steps:
    """Runs the steps --skip leaves in, printing and keeping each one's figures."""

    def __init__(self, skip: set[str], out: Path) -> None:
        self.skip = skip
        self.out = out
        self.results: dict[str, Any] = {}

    def wanted(self, *names: str) -> bool:
        return not set(names) <= self.skip

    def run(self, name: str, run: Callable[[], Any]) -> None:
        if name in self.skip:
            return
        print(f"-- {name}", flush=True)
        self.results[name] = run()
        print(json.dumps(self.results[name]), flush=True)
        self.save()  # what ran is kept if a later step fails or the run is cut short

    def save(self) -> None:
        self.out.write_text(json.dumps(self.results, indent=2) + "\n")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="bulk prompts")
    parser.add_argument("--rates", default="1,2,4", help="interactive arrivals per second")
    parser.add_argument("--duration", type=float, default=30, help="seconds per rate")
    parser.add_argument("--pipeline-lines", type=int, default=20_000)
    parser.add_argument(
        "--priority-batch-lines", type=int, default=20_000, help="the batch the priority step runs"
    )
    parser.add_argument(
        "--priority-window", type=float, default=60, help="seconds per priority window"
    )
    parser.add_argument(
        "--priority-rate", type=float, default=2, help="its interactive arrivals per second"
    )
    parser.add_argument(
        "--skip", default="", help=f"comma-separated steps to leave out: {','.join(STEPS)}"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--model", type=Path, help="a model directory (default: the CPU bench model, built here)"
    )
    parser.add_argument("--gpu", action="store_true", help="GPU engine settings (8B INT4)")
    args = parser.parse_args()
    unknown = set(filter(None, args.skip.split(","))) - set(STEPS)
    if unknown:  # a misspelt step would otherwise run, and take its time
        parser.error(f"--skip: no step named {', '.join(sorted(unknown))}")
    return args


def _serve_steps(
    steps: Steps, engine: dict[str, Any], workdir: Path, bodies: list[dict[str, Any]]
) -> None:
    """One `vllm serve` process, driven at each concurrency in turn."""
    names = [single_key("serve", c) for c in CONCURRENCIES]
    if not steps.wanted(*names):
        return
    with serve(engine, workdir) as url:
        for name, concurrency in zip(names, CONCURRENCIES, strict=True):
            steps.run(name, partial(drive.serve_chats, url, bodies, concurrency=concurrency))


def _inferq_steps(
    steps: Steps,
    args: argparse.Namespace,
    *,
    model: Path,
    engine: dict[str, Any],
    workdir: Path,
    bodies: list[dict[str, Any]],
    priority_file: Path | None,
) -> None:
    """Every step on the real engine, in one deployment."""
    jobs = [single_key("inferq-jobs", c) for c in CONCURRENCIES]
    if not steps.wanted("inferq-batch", *jobs, "idle", "interactive", "priority"):
        return
    with inferq(model, workdir, **inferq_env(engine)) as url:
        steps.run("inferq-batch", lambda: run_inferq_batch(url, workdir / "batch.jsonl"))
        for name, concurrency in zip(jobs, CONCURRENCIES, strict=True):
            steps.run(name, partial(drive.inferq_jobs, url, bodies, concurrency=concurrency))
        steps.run("idle", lambda: run_idle(url, bodies[0], IDLE_JOBS))
        rates = [float(r) for r in args.rates.split(",")]
        steps.run("interactive", lambda: run_interactive(url, bodies[0], rates, args.duration))
        # Last: it leaves a cancelled batch behind, and it needs the idle figures.
        if priority_file is not None:
            steps.run(
                "priority",
                lambda: run_priority(
                    url,
                    batch_file=priority_file,
                    lines=args.priority_batch_lines,
                    body=bodies[0],
                    window_s=args.priority_window,
                    rate_per_s=args.priority_rate,
                    max_num_seqs=int(engine["max_num_seqs"]),
                    idle=steps.results.get("idle"),
                ),
            )


def main() -> None:
    args = _parse()
    args.out.mkdir(parents=True, exist_ok=True)
    steps = Steps(set(filter(None, args.skip.split(","))), args.out / "compare.json")
    from transformers import AutoTokenizer

    model = args.model or stack.demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=args.gpu)
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests = workload.bulk(tokenizer, args.requests, context=engine["max_model_len"])
    steps.results["expected_tokens"] = sum(r.max_tokens for r in requests)
    workdir = args.out / "work"  # inputs and every process's log, kept for a look after
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    requests_json = workload.save(requests, workdir / "requests.json")
    batch_file = workload.write_batch_file(requests, SERVED, workdir / "batch.jsonl")
    priority_file = None
    if steps.wanted("priority"):
        # Prompts of their own (another seed), the same lengths' law: no prefix the
        # engine's cache still holds from the bulk steps.
        priority = workload.bulk(
            tokenizer,
            args.priority_batch_lines,
            context=engine["max_model_len"],
            seed=workload.SEED + 1,
        )
        priority_file = workload.write_batch_file(priority, SERVED, workdir / "priority.jsonl")
    bodies = [workload.body(r, SERVED) for r in requests]

    steps.run("engine", lambda: run_engine(requests_json, engine, workdir))
    local_env = {
        **inferq_env(engine),
        "INFERQ_MODEL": str(model),
        "INFERQ_SERVED_MODEL_NAME": SERVED,
    }
    steps.run("inferq-run", lambda: run_inferq_local(batch_file, local_env, workdir))
    steps.run("run-batch", lambda: run_run_batch(batch_file, engine, workdir))
    _serve_steps(steps, engine, workdir, bodies)
    _inferq_steps(
        steps,
        args,
        model=model,
        engine=engine,
        workdir=workdir,
        bodies=bodies,
        priority_file=priority_file,
    )
    steps.run("pipeline", lambda: run_pipeline(workdir, args.pipeline_lines))
    results = steps.results
    steps.save()
    if len(results) > 1:  # more than the expected tokens
        print("\n" + table(results))
        chart(results, args.out / "compare.png")


if __name__ == "__main__":
    main()
