"""Following a batch's output live (`GET /v1/batches/{id}/output?follow=true`, and
`inferq batch follow`) against a running inferq: API, GPU worker (vLLM on CPU), Redis,
Postgres. Every line once, in input order, across a dropped connection and a killed
follower."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from httpx_sse import ServerSentEvent, connect_sse

from tests.conftest import ADMIN_KEY, Stack
from tests.helpers.metrics import worker_idle
from tests.helpers.waiting import wait_until
from tests.integration.api.test_batch_output import (
    QUICK,
    SLOW,
    quick_lines_ended,
    running_batch,
)
from tests.integration.api.test_batches import client_for, wait_for

pytestmark = pytest.mark.engine


def follow(
    stack: Stack, batch_id: str, *, last_event_id: int | None, stop_after: int | None
) -> list[ServerSentEvent]:
    """The events of one following connection: until `end`, or `stop_after` line events
    (then the connection is dropped)."""
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    events: list[ServerSentEvent] = []
    with (
        stack.client() as http,
        connect_sse(
            http,
            "GET",
            f"/v1/batches/{batch_id}/output",
            params={"follow": "true", "include": "errors"},
            headers=headers,
        ) as source,
    ):
        assert source.response.status_code == 200
        for event in source.iter_sse():
            events.append(event)
            lines = sum(e.event == "line" for e in events)
            if event.event == "end" or lines == stop_after:
                break
    return events


def test_a_followed_batch_sends_every_line_once_in_order_across_a_reconnect(
    stack: Stack,
) -> None:
    client = client_for(stack)
    batch_id = running_batch(stack)
    with stack.client() as http:
        quick_lines_ended(http, batch_id)
    # The worker (and its engine) frozen from the quick lines' end to the cancel: however
    # quick the machine, or slow the client, the slow lines are still running then.
    with stack.worker.frozen():
        # The quick lines come while the slow ones still run: then the connection drops.
        first = follow(stack, batch_id, last_event_id=None, stop_after=QUICK)
        assert [e.id for e in first] == [str(n) for n in range(1, QUICK + 1)]
        assert client.batches.retrieve(batch_id).status == "in_progress"
        client.batches.cancel(batch_id)
    rest = follow(stack, batch_id, last_event_id=int(first[-1].id), stop_after=None)
    end = rest.pop()
    assert end.event == "end"
    lines = first + rest
    assert [int(e.id) for e in lines] == list(range(1, QUICK + SLOW + 1))
    assert {e.event for e in lines} == {"line"}

    batch = json.loads(end.data)
    assert batch["status"] == "cancelled"
    assert batch["request_counts"]["total"] == QUICK + SLOW
    # What came is the output and error files, line for line.
    sent = [json.loads(e.data) for e in lines]
    assert [s["custom_id"] for s in sent] == [f"req-{i}" for i in range(QUICK + SLOW)]
    outputs = b"".join(
        e.data.encode() + b"\n" for e, s in zip(lines, sent, strict=True) if not s["error"]
    )
    errors = b"".join(
        e.data.encode() + b"\n" for e, s in zip(lines, sent, strict=True) if s["error"]
    )
    assert outputs == client.files.content(batch["output_file_id"]).content
    assert errors == client.files.content(batch["error_file_id"]).content

    # Following an ended batch from its last line sends only the end.
    [again] = follow(stack, batch_id, last_event_id=QUICK + SLOW, stop_after=None)
    assert again.event == "end"
    # The worker, frozen when the cancel came, is done with it before the next test.
    wait_until(lambda: worker_idle(stack.worker.metrics_url), timeout_s=60, what="idle")


def test_follow_writes_the_files_as_they_grow_and_goes_on_after_a_kill(
    stack: Stack, tmp_path: Path
) -> None:
    client = client_for(stack)
    batch_id = running_batch(stack)
    out = tmp_path / "out.jsonl"
    command = [sys.executable, "-m", "cli.main", "batch", "follow", batch_id, "-o", str(out)]
    command += ["--url", stack.url]
    env = {**os.environ, "INFERQ_API_KEY": ADMIN_KEY}

    def lines_written() -> int:
        state = out.with_name("out.jsonl.follow")
        saved: dict[str, Any] = json.loads(state.read_text()) if state.exists() else {}
        return int(saved.get("lines", 0))

    with stack.client() as http:
        quick_lines_ended(http, batch_id)
    # The worker frozen from the quick lines' end to the cancel, so slow lines are still
    # running (and are cancelled: an error file), however slowly the follower starts.
    with stack.worker.frozen():
        # Killed once the quick lines are in: nothing of the run is cleaned up.
        running = subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: lines_written() >= QUICK, timeout_s=120, what="the quick lines")
        finally:
            running.send_signal(signal.SIGKILL)
            running.wait(timeout=30)
        assert len(out.read_text().splitlines()) >= QUICK
        assert client.batches.retrieve(batch_id).status == "in_progress"
        client.batches.cancel(batch_id)
    batch = wait_for(client, batch_id)
    done = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert f"batch {batch_id} cancelled" in done.stderr
    assert batch.output_file_id is not None
    assert batch.error_file_id is not None
    assert out.read_bytes() == client.files.content(batch.output_file_id).content
    errors = out.with_suffix(".errors.jsonl")
    assert errors.read_bytes() == client.files.content(batch.error_file_id).content
    assert lines_written() == QUICK + SLOW

    # Run again, it has nothing to add.
    again = subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0, again.stderr
    assert out.read_bytes() == client.files.content(batch.output_file_id).content
    wait_until(lambda: worker_idle(stack.worker.metrics_url), timeout_s=60, what="idle")
