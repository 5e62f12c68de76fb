"""When a batch will end and what it will cost, against a running inferq (API, GPU worker
with vLLM on CPU, housekeeper, Redis, Postgres): the estimate a batch carries from its
creation, kept up to date while it runs, and the one `inferq batch submit --estimate`
gives before anything is queued. How close it comes is measured in bench/estimates.py."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from sqlalchemy import select

from inferq.store.models import EngineSpeedRow
from tests.conftest import Stack
from tests.helpers.waiting import wait_until
from tests.integration.api.test_batches import chat_line, client_for, upload, wait_for

pytestmark = pytest.mark.engine

LINES = 48
MAX_TOKENS = 300


def measured(stack: Stack, client: OpenAI) -> None:
    """Make sure the worker has reported its engine's speed at load (a rate at lower load
    makes no estimate): until it has, give it batches that fill the engine for seconds."""

    def reported() -> bool:
        with stack.sessions() as session:
            return bool(session.scalar(select(EngineSpeedRow.at_load)))

    for _ in range(5):
        if reported():
            return
        lines = [chat_line(i, max_tokens=128, ignore_eos=True) for i in range(64)]
        batch = client.batches.create(
            input_file_id=upload(client, lines),
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
        wait_for(client, batch.id)
        # The worker reports every few seconds.
        with contextlib.suppress(AssertionError):
            wait_until(reported, timeout_s=15, what="the worker's speed report at load")
    assert reported(), "the worker never reported a speed measured at load"


def estimate_of(client: OpenAI, batch_id: str) -> tuple[Any, dict[str, Any] | None]:
    batch = client.batches.retrieve(batch_id)
    extra = batch.model_extra or {}
    return batch, extra.get("estimate")


def test_a_batch_says_when_it_will_end_from_creation_to_its_end(stack: Stack) -> None:
    client = client_for(stack)
    measured(stack, client)
    lines = [chat_line(i, max_tokens=MAX_TOKENS, ignore_eos=True) for i in range(LINES)]
    created = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    # An extension field: the openai client keeps it beside the fields it knows.
    first = (created.model_extra or {})["estimate"]
    assert (created.model_extra or {})["estimated_completion_at"] == first["completion_at"]
    assert created.created_at <= first["earliest_completion_at"] <= first["completion_at"]
    assert first["completion_at"] <= first["latest_completion_at"]
    assert first["output_tokens_max"] == LINES * MAX_TOKENS
    assert 0 < first["output_tokens"] <= first["output_tokens_max"]
    assert first["tokens_per_s"] > 0

    # Frozen once some lines have ended, the batch stays in progress while maintenance
    # estimates it again from what its lines generated: every one runs to max_tokens.
    def some_ended() -> bool:
        return client.batches.retrieve(created.id).request_counts.completed >= 3  # type: ignore[union-attr]

    wait_until(some_ended, timeout_s=120, what="lines ended")
    # An estimate made before then may count fewer ended lines: wait for one made after
    # (`updated_at` is in whole seconds, on this machine's clock).
    seen_at = int(time.time())
    with stack.worker.frozen():
        batch, _ = estimate_of(client, created.id)
        assert batch.status == "in_progress"

        def refreshed() -> dict[str, Any] | None:
            _, estimate = estimate_of(client, created.id)
            assert estimate is not None
            if estimate["updated_at"] <= seen_at:
                return None
            return estimate

        later = wait_until(refreshed, timeout_s=30, what="the estimate made again")
        assert later["output_tokens"] == LINES * MAX_TOKENS
        assert later["input_tokens"] == first["input_tokens"]

    ended = wait_for(client, created.id)
    assert ended.status == "completed"
    assert ended.usage is not None
    assert ended.usage.input_tokens == first["input_tokens"]
    assert ended.usage.output_tokens == LINES * MAX_TOKENS
    # Once it has ended there is nothing left to estimate.
    assert (ended.model_extra or {})["estimate"] is None
    assert (ended.model_extra or {})["estimated_completion_at"] is None


def batch_cli(stack: Stack, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", "batch", *args, "--url", stack.url],
        env={**os.environ, "INFERQ_API_KEY": key},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_an_estimate_before_submitting_queues_nothing(stack: Stack, tmp_path: Path) -> None:
    measured(stack, client_for(stack))
    key = stack.new_key()
    client = client_for(stack, key)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(chat_line(i, max_tokens=20)) + "\n" for i in range(30)))

    result = batch_cli(stack, key, "submit", str(source), "--estimate")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("30 lines: expected to end at ")
    assert "at most 600)" in result.stdout
    # Nothing queued, and the file it sent is gone.
    assert client.batches.list().data == []
    assert client.files.list().data == []

    # A file a batch would refuse says which line, and still leaves nothing behind.
    bad = dict(chat_line(30), body={"model": "tiny", "messages": [], "top_p": 3})
    source.write_text(source.read_text() + json.dumps(bad) + "\n")
    refused = batch_cli(stack, key, "submit", str(source), "--estimate")
    assert refused.returncode == 1
    assert "line 31 (custom_id 'req-30')" in refused.stderr
    assert client.batches.list().data == []
    assert client.files.list().data == []


def test_the_estimate_endpoint_speaks_json(stack: Stack) -> None:
    measured(stack, client_for(stack))
    key = stack.new_key()
    client = client_for(stack, key)
    file_id = upload(client, [chat_line(i, max_tokens=10) for i in range(5)])
    with stack.client(key) as http:
        response = http.post(
            "/v1/batch-estimates",
            json={"input_file_id": file_id, "endpoint": "/v1/chat/completions"},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["object"] == "batch.estimate"
        assert (body["model"], body["lines"], body["errors"]) == ("tiny", 5, None)
        assert body["estimate"]["output_tokens_max"] == 50
        assert body["estimated_completion_at"] == body["estimate"]["completion_at"]

        missing = http.post(
            "/v1/batch-estimates",
            json={"input_file_id": "file-nope", "endpoint": "/v1/chat/completions"},
        )
        assert missing.status_code == 422
        assert "file-nope" in missing.json()["error"]["message"]
    assert client.batches.list().data == []
