"""inferq side by side with vLLM, on the same prompts and engine settings, in one run.

    python -m bench.compare                       # everything
    python -m bench.compare --requests 500 --skip serve,run-batch

Systems, each in processes of its own, one after another:
- engine: every prompt through one `LLM.generate` call (the limit);
- run-batch: `vllm run-batch` on the same file in OpenAI Batch format;
- serve: vLLM's OpenAI server, driven by an async client at concurrency 64;
- inferq-batch: the file through `POST /v1/batches` until its output file is read;
- inferq-jobs: the same prompts as single `POST /v1/jobs` submissions;
- interactive: single jobs on Poisson arrivals at several rates (latency against load);
- pipeline: inferq with the instant engine (no model): jobs/s through API, Redis, worker
  and Postgres, for batch lines and for single jobs.
Prints a table of tokens/s with ratios to the engine limit, and writes the figures
(JSON) and a chart (PNG) to --out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai

from bench import stack, workload
from bench.peers import SERVED, run_engine, run_run_batch, run_serve, throughput
from bench.report import chart, table
from inferq.demo_model import BENCH, CPU_DTYPE
from inferq.kv_cache import ModelShape, sequence_bytes

MAX_NUM_SEQS = 64
JOB_CONCURRENCY = 256
IDLE_JOBS = 20


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
    """API, GPU worker, delivery/maintenance worker and beat on a database of their own."""
    with ExitStack() as cleanup:
        url = cleanup.enter_context(stack.database())
        prefix = cleanup.enter_context(stack.key_prefix())
        env = stack.service_env(model=model, database_url=url, prefix=prefix, **extra)
        _, base_url = cleanup.enter_context(stack.api(env, workdir))
        worker_env = {**env, "INFERQ_WORKER_METRICS_PORT": str(stack.free_port())}
        worker = stack.Process(
            ["worker", "--name", "bench@host"], env=worker_env, log=workdir / "worker.log"
        )
        cleanup.callback(worker.stop)
        service = stack.Process(
            ["webhooks", "--name", "service@host"], env=env, log=workdir / "service.log"
        )
        cleanup.callback(service.stop)
        beat = stack.Process(["beat"], env=env, log=workdir / "beat.log")
        cleanup.callback(beat.stop)
        worker.wait_for(" ready.", timeout_s=600)
        service.wait_for(" ready.", timeout_s=120)
        yield base_url


def run_inferq_batch(base_url: str, batch_file: Path) -> dict[str, Any]:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=stack.ADMIN_KEY, timeout=3600)
    started = time.perf_counter()
    with batch_file.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint=workload.CHAT_URL, completion_window="24h"
    )
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        time.sleep(0.25)
        batch = client.batches.retrieve(batch.id)
    assert batch.status == "completed", batch
    assert batch.output_file_id is not None
    content = client.files.content(batch.output_file_id).text
    seconds = time.perf_counter() - started
    lines = [json.loads(line) for line in content.splitlines()]
    tokens = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in lines)
    return throughput(seconds, tokens, len(lines))


async def _submit_and_wait(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    response = await client.post("/v1/jobs", json=body)
    response.raise_for_status()
    job: dict[str, Any] = response.json()
    while job["status"] in ("queued", "running"):
        response = await client.get(f"/v1/jobs/{job['id']}", params={"wait": 60})
        response.raise_for_status()
        job = response.json()
    return time.perf_counter() - started, job


def _client(base_url: str, connections: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        headers={"Authorization": f"Bearer {stack.ADMIN_KEY}"},
        timeout=3600,
        limits=httpx.Limits(max_connections=connections),
    )


def run_inferq_jobs(base_url: str, bodies: list[dict[str, Any]]) -> dict[str, Any]:
    async def drive() -> tuple[float, list[dict[str, Any]]]:
        async with _client(base_url, JOB_CONCURRENCY) as client:
            gate = asyncio.Semaphore(JOB_CONCURRENCY)

            async def one(body: dict[str, Any]) -> dict[str, Any]:
                async with gate:
                    return (await _submit_and_wait(client, body))[1]

            started = time.perf_counter()
            jobs = await asyncio.gather(*(one(b) for b in bodies))
            return time.perf_counter() - started, jobs

    seconds, jobs = asyncio.run(drive())
    assert all(j["status"] == "succeeded" for j in jobs), [j["status"] for j in jobs][:5]
    tokens = sum(j["usage"]["completion_tokens"] for j in jobs)
    return throughput(seconds, tokens, len(jobs))


def run_idle(base_url: str, body: dict[str, Any], count: int) -> dict[str, Any]:
    """One job at a time on an otherwise idle system: submission to result."""

    async def drive() -> list[float]:
        async with _client(base_url, 1) as client:
            return [(await _submit_and_wait(client, body))[0] for _ in range(count)]

    latencies = asyncio.run(drive())
    return {"jobs": count, "p50_s": statistics.median(latencies), "max_s": max(latencies)}


def run_interactive(
    base_url: str, body: dict[str, Any], rates: list[float], duration_s: float
) -> list[dict[str, Any]]:
    """Single jobs arriving as a Poisson process at each rate: time to result."""
    rng = random.Random(workload.SEED)

    async def at_rate(rate: float) -> dict[str, Any]:
        async with _client(base_url, 512) as client:
            tasks = []
            started = time.perf_counter()
            while time.perf_counter() - started < duration_s:
                tasks.append(asyncio.create_task(_submit_and_wait(client, body)))
                await asyncio.sleep(rng.expovariate(rate))
            latencies = sorted(seconds for seconds, _ in await asyncio.gather(*tasks))
        cuts = statistics.quantiles(latencies, n=100)
        return {
            "rate": rate,
            "jobs": len(latencies),
            "p50_s": statistics.median(latencies),
            "p95_s": cuts[94],
            "p99_s": cuts[98],
        }

    return [asyncio.run(at_rate(rate)) for rate in rates]


def run_pipeline(workdir: Path, lines: int) -> dict[str, Any]:
    """jobs/s through inferq with an engine that answers at once (no model)."""
    model = stack.demo_model()  # only its tokenizer is used
    requests = [workload.Request(f"p{i}", f"item {i}", 1) for i in range(lines)]
    batch_file = workload.write_batch_file(requests, SERVED, workdir / "pipeline.jsonl")
    with inferq(
        model,
        workdir,
        INFERQ_ENGINE="instant",
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
        single = run_inferq_jobs(url, [workload.body(r, SERVED) for r in requests[:5000]])
    return {
        "batch_lines": lines,
        "batch_jobs_per_s": batch_jobs_per_s,
        "single_jobs": single["requests"],
        "single_jobs_per_s": single["requests_per_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="bulk prompts")
    parser.add_argument("--rates", default="1,2,4", help="interactive arrivals per second")
    parser.add_argument("--duration", type=float, default=30, help="seconds per rate")
    parser.add_argument("--pipeline-lines", type=int, default=20_000)
    parser.add_argument("--skip", default="", help="comma-separated systems to leave out")
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument(
        "--model", type=Path, help="a model directory (default: the CPU bench model, built here)"
    )
    parser.add_argument("--gpu", action="store_true", help="GPU engine settings (8B INT4)")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    model = args.model or stack.demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=args.gpu)
    requests = workload.bulk(
        AutoTokenizer.from_pretrained(model), args.requests, context=engine["max_model_len"]
    )
    results: dict[str, Any] = {"expected_tokens": sum(r.max_tokens for r in requests)}
    workdir = args.out / "work"  # inputs and every process's log, kept for a look after
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    requests_json = workload.save(requests, workdir / "requests.json")
    batch_file = workload.write_batch_file(requests, SERVED, workdir / "batch.jsonl")

    def step(name: str, run: Any) -> None:
        if name in skip:
            return
        print(f"-- {name}", flush=True)
        results[name] = run()
        print(json.dumps(results[name]), flush=True)

    step("engine", lambda: run_engine(requests_json, engine, workdir))
    load_s = results.get("engine", {}).get("load_s", 0.0)
    step("run-batch", lambda: run_run_batch(batch_file, engine, workdir, load_s))
    step("serve", lambda: run_serve(requests, engine, workdir))
    if not {"inferq-batch", "inferq-jobs", "idle", "interactive"} <= skip:
        with inferq(model, workdir, **inferq_env(engine)) as url:
            bodies = [workload.body(r, SERVED) for r in requests]
            step("inferq-batch", lambda: run_inferq_batch(url, batch_file))
            step("inferq-jobs", lambda: run_inferq_jobs(url, bodies))
            step("idle", lambda: run_idle(url, bodies[0], IDLE_JOBS))
            rates = [float(r) for r in args.rates.split(",")]
            step(
                "interactive",
                lambda: run_interactive(url, bodies[0], rates, args.duration),
            )
    step("pipeline", lambda: run_pipeline(workdir, args.pipeline_lines))
    (args.out / "compare.json").write_text(json.dumps(results, indent=2) + "\n")
    if "engine" in results:
        print("\n" + table(results))
        chart(results, args.out / "compare.png")


if __name__ == "__main__":
    main()
