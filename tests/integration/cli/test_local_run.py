"""`inferq run FILE`: the whole pipeline in one process, on SQLite and the demo model,
through the real command (real vLLM on the CPU)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cli.demo_model import DEMO
from cli.local_run import LocalRun, local_settings
from cli.prompt_files import Defaults, prepare
from inferq.settings import Settings
from tests.helpers.processes import (
    ENGINE_CORE_ALONE,
    ENGINE_CORE_APART,
    ENGINE_CORE_HERE,
    INFERQ,
    ONE_PROCESS_EXECUTOR,
)

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("local_run")]

ROOT = Path(__file__).resolve().parents[3]


def _env(cache: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    # The demo model is built once into the tests' cache, not the user's.
    return {
        **env,
        **ENGINE_CORE_HERE,
        "XDG_CACHE_HOME": str(cache),
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _start(
    args: list[str],
    *,
    cache: Path,
    log: Path,
    env: dict[str, str] | None = None,
    program: list[str] = INFERQ,
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [*program, "run", *args],
            env=_env(cache, env),
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _finish(process: subprocess.Popen[bytes], log: Path, timeout_s: float = 600) -> int:
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        pytest.fail(f"inferq run did not end:\n{log.read_text()[-4000:]}")


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _rows(state: Path) -> dict[int, tuple[str, str | None, str | None]]:
    """line -> (status, finished_at, output) for every job in the state file."""
    with sqlite3.connect(state, timeout=30) as db:
        rows = db.execute("SELECT line, status, finished_at, choices FROM jobs").fetchall()
    return {line: (status, finished, choices) for line, status, finished, choices in rows}


def _succeeded(state: Path) -> int:
    if not state.exists():
        return 0
    try:
        return sum(1 for status, _, _ in _rows(state).values() if status == "succeeded")
    except sqlite3.OperationalError:  # the schema is not there yet
        return 0


def _wait_succeeded(state: Path, count: int, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 300
    while _succeeded(state) < count:
        if process.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the run ended or stalled early:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def test_the_readme_example_runs_on_the_demo_model(cache: Path, tmp_path: Path) -> None:
    out, log = tmp_path / "out.jsonl", tmp_path / "run.log"
    # As the front page gives it (with the output put aside), vLLM as it runs by default:
    # scripts/inferq run ...
    run = _start(
        ["examples/prompts.jsonl", "--model", "demo", "-o", str(out)],
        cache=cache,
        log=log,
        env=ENGINE_CORE_APART,
        program=[str(ROOT / "scripts" / "inferq")],
    )
    assert _finish(run, log) == 0, log.read_text()[-4000:]
    said = log.read_text()
    assert "NOT a real language model" in said
    assert "16 succeeded, 0 failed of 16 lines" in said
    assert "loaded in" in said
    assert "tok/s" in said
    inputs = _read_jsonl(ROOT / "examples" / "prompts.jsonl")
    lines = _read_jsonl(out)
    assert [line["custom_id"] for line in lines] == [i["custom_id"] for i in inputs]
    for line in lines:
        assert line["error"] is None
        assert line["response"]["status_code"] == 200
        body = line["response"]["body"]
        assert body["object"] == "chat.completion"
        assert body["model"] == "demo"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert 0 < body["usage"]["completion_tokens"] <= 48
    assert not out.with_suffix(".errors.jsonl").exists()


def test_interrupted_runs_resume_without_losing_or_repeating_a_line(
    cache: Path, tmp_path: Path
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Tell me fact number {i} about rivers.\n" for i in range(1000)))
    out, state, log = tmp_path / "out.jsonl", tmp_path / "run.state", tmp_path / "run.log"
    args = [str(prompts), "--model", "demo", "-o", str(out), "--state", str(state)]
    args += ["--max-tokens", "16"]

    # Ctrl-C: lines in flight go back to queued; the run says how to resume.
    run = _start(args, cache=cache, log=log)
    _wait_succeeded(state, 100, run, log)
    run.send_signal(signal.SIGINT)
    assert _finish(run, log) == 130, log.read_text()[-4000:]
    assert "run the same command again to resume" in log.read_text()
    after_interrupt = _rows(state)
    assert len(after_interrupt) == 1000
    assert {status for status, _, _ in after_interrupt.values()} <= {"succeeded", "queued"}
    assert not out.exists()

    # Killed outright: whatever was in the engine was never written.
    run = _start(args, cache=cache, log=log)
    _wait_succeeded(state, _succeeded(state) + 100, run, log)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    after_kill = _rows(state)

    run = _start(args, cache=cache, log=log)
    assert _finish(run, log) == 0, log.read_text()[-4000:]
    final = _rows(state)
    # A line done before an interruption was never run again: its result is untouched.
    for before in (after_interrupt, after_kill):
        for line, row in before.items():
            if row[0] == "succeeded":
                assert final[line] == row
    assert {status for status, _, _ in final.values()} == {"succeeded"}
    lines = _read_jsonl(out)
    assert [line["custom_id"] for line in lines] == [f"line-{i}" for i in range(1, 1001)]
    assert all(line["response"]["status_code"] == 200 for line in lines)


def test_a_state_file_of_another_input_is_refused(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    first.write_text("one\n")
    second.write_text("two\n")
    state, log = tmp_path / "shared.state", tmp_path / "run.log"
    # The state of a run of a.txt that was stopped before it ended (no engine needed).
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    local = LocalRun(local_settings(Settings(), DEMO), state=state)
    ready = prepare(first, Defaults(model=DEMO), workdir=tmp_path)
    local.open_batch(ready.path, endpoint=ready.endpoint, name=first.name)
    local.close()
    run = _start([str(second), "--model", "demo", "--state", str(state)], cache=cache, log=log)
    assert _finish(run, log) == 2
    assert "belongs to another input file, or other options (a.txt)" in log.read_text()
    assert _rows(state).keys() == {1}  # b.txt's line was not added


def _said_in_one_line(log: Path, *texts: str) -> str:
    """The line of the run's output that says all of `texts`; no traceback anywhere."""
    said = log.read_text()
    assert "Traceback" not in said, said[-4000:]
    assert "Engine core initialization failed" not in said, said[-4000:]
    lines = [line for line in said.splitlines() if all(text in line for text in texts)]
    assert len(lines) == 1, said[-4000:]
    return lines[0]


def _failed_example(cache: Path, tmp_path: Path, env: dict[str, str]) -> Path:
    """The README's example run with `env`, which must fail with exit status 2: its log."""
    log = tmp_path / "run.log"
    args = ["examples/prompts.jsonl", "--model", "demo", "-o", str(tmp_path / "out.jsonl")]
    assert _finish(_start(args, cache=cache, log=log, env=env), log, timeout_s=300) == 2
    return log


def test_a_kv_cache_this_host_cannot_hold_is_refused_before_the_engine_loads(
    cache: Path, tmp_path: Path
) -> None:
    log = _failed_example(cache, tmp_path, {"INFERQ_KV_CACHE_MEMORY_BYTES": "1TiB"})
    line = _said_in_one_line(log, "inferq: INFERQ_KV_CACHE_MEMORY_BYTES asks for 1024.00 GiB")
    assert "lower it to at most" in line
    assert "loading demo" in log.read_text()
    assert "vLLM could not start" not in log.read_text()  # vLLM was never started


def test_an_engine_that_fails_to_start_says_why_in_one_line(cache: Path, tmp_path: Path) -> None:
    # Past every preflight check, vLLM's engine core refuses a cache of one block: its
    # reason is in the core process's output, which the user never has to read.
    extra = {"num_gpu_blocks_override": 1, **ONE_PROCESS_EXECUTOR}
    log = _failed_example(
        cache,
        tmp_path,
        {**ENGINE_CORE_ALONE, "INFERQ_ENGINE_EXTRA_ARGS": json.dumps(extra)},
    )
    line = _said_in_one_line(log, "inferq: vLLM could not start")
    assert "No available memory for the cache blocks" in line
    assert "inferq doctor" in line
    assert len(log.read_text().splitlines()) < 10, log.read_text()


@pytest.mark.parametrize("shape", ["prompt objects", "batch lines"])
def test_a_bad_file_is_reported_line_by_line_and_nothing_runs(
    cache: Path, tmp_path: Path, shape: str
) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    if shape == "prompt objects":
        lines = ['{"prompt": "fine"}', deep, '{"messages": []}', '{"prompt": "also fine"}']
        expected = ["line 2 is not a JSON object", "line 3 has no 'prompt'"]
    else:
        body = {"model": "demo", "prompt": "hi", "max_tokens": 4}
        good = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": body}
        lines = [json.dumps(good), deep, json.dumps({**good, "custom_id": 7})]
        expected = ["line 2 is nested too deeply", "line 3 (custom_id 7): custom_id"]
    source, log = tmp_path / "bad.jsonl", tmp_path / "run.log"
    source.write_text("\n".join(lines) + "\n")
    run = _start([str(source), "--model", "demo"], cache=cache, log=log)
    assert _finish(run, log, timeout_s=120) == 1
    said = log.read_text()
    assert "Traceback" not in said, said[-4000:]
    for words in expected:
        assert words in said, said[-4000:]
    assert f"inferq: {source} has lines that cannot run; nothing ran" in said
    assert "loading demo" not in said
