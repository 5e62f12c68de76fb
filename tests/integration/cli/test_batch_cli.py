"""`inferq batch ...` against the running stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.engine


def inferq(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "batch", *args, "--url", stack.url],
        env={**os.environ, "INFERQ_API_KEY": ADMIN_KEY},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_submit_a_text_file_wait_and_get_the_results(stack: Stack, tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"Tell me about {i}\n" for i in range(6)))
    out = tmp_path / "out.jsonl"
    result = inferq(stack, "submit", str(prompts), "--wait", "-o", str(out), "--max-tokens", "6")
    assert result.returncode == 0, result.stderr
    batch_id = result.stdout.strip()
    assert batch_id.startswith("batch_")
    assert "completed: 6 succeeded, 0 failed of 6" in result.stderr
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == [f"line-{i}" for i in range(1, 7)]
    assert all(line["response"]["body"]["object"] == "chat.completion" for line in lines)
    assert not out.with_suffix(".errors.jsonl").exists()

    status = inferq(stack, "status", batch_id)
    assert status.returncode == 0
    assert f"{batch_id}  completed  6 done, 0 failed of 6" in status.stdout
    assert batch_id in inferq(stack, "list").stdout


def test_an_invalid_file_is_refused_line_by_line(stack: Stack, tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    good = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/completions",
        "body": {"model": "tiny", "prompt": "x"},
    }
    bad = {**good, "custom_id": "b", "body": {"model": "tiny", "prompt": "x", "top_p": 3}}
    source.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    result = inferq(stack, "submit", str(source))
    assert result.returncode == 1
    assert "line 2 (custom_id 'b'): body.top_p" in result.stderr


def test_cancel_from_the_command_line(stack: Stack, tmp_path: Path) -> None:
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(
        "".join(
            # Far more work than can finish before the cancel arrives.
            json.dumps({"prompt": f"p{i}", "max_tokens": 1000, "ignore_eos": True}) + "\n"
            for i in range(400)
        )
    )
    submitted = inferq(stack, "submit", str(prompts))
    assert submitted.returncode == 0, submitted.stderr
    batch_id = submitted.stdout.strip()
    cancelled = inferq(stack, "cancel", batch_id)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.split() in ([batch_id, "cancelling"], [batch_id, "cancelled"])
    deadline = time.monotonic() + 180
    while "  cancelled  " not in (status := inferq(stack, "status", batch_id).stdout):
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    out = tmp_path / "partial.jsonl"
    downloaded = inferq(stack, "download", batch_id, "-o", str(out))
    assert downloaded.returncode == 0, downloaded.stderr
    errors = [
        json.loads(line) for line in out.with_suffix(".errors.jsonl").read_text().splitlines()
    ]
    kept = out.read_text().splitlines() if out.exists() else []
    assert len(errors) + len(kept) == 400
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
