"""Priorities: a single job overtakes the batch lines that fill a worker, and the `priority`
field on jobs and batches. Real API, worker and vLLM on the CPU."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import httpx
import pytest
from openai import OpenAI

from inferq.domain.jobs import MAX_PRIORITY
from tests.conftest import Stack
from tests.integration.api.test_batches import chat_line, client_for, upload
from tests.integration.api.test_jobs_end_to_end import run

pytestmark = pytest.mark.engine

# The shared stack's worker runs 16 batch lines at once (INFERQ_MAX_NUM_SEQS), keeps
# 16 / 8 = 2 more engine slots for single jobs, and holds 18 + 8 Celery messages at once;
# its feeder claims up to 8 lines at a time (INFERQ_MAX_BATCH_SIZE).
BATCH_SLOTS = 16
MESSAGE_SLOTS = 26
CHUNK_LINES = 8


def test_a_single_job_overtakes_the_batch_lines_that_fill_the_worker(
    stack: Stack,
) -> None:
    # More long lines than the worker has message slots: batch lines hold no message slot,
    # so the job's message is taken at once; single jobs go first in the admission queue and
    # have engine slots kept for them, so the job ends before any line the worker claimed
    # ahead of it. Without that it would wait for a line to end, hundreds of steps later.
    with client_for(stack) as openai:
        _fill_and_submit(stack, openai)


def _fill_and_submit(stack: Stack, openai: OpenAI) -> None:
    count = (MESSAGE_SLOTS + 4) * CHUNK_LINES
    lines = [chat_line(i, max_tokens=900, ignore_eos=True) for i in range(count)]
    batch = openai.batches.create(
        input_file_id=upload(openai, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"priority": 3},
    )
    assert batch.model_extra is not None
    assert batch.model_extra["priority"] == 3
    with stack.client() as client:
        try:
            deadline = time.monotonic() + 120
            while len(ahead := _lines(client, batch.id, "running")) < BATCH_SLOTS:
                assert time.monotonic() < deadline, "the batch never filled the engine"
                time.sleep(0.1)
            job = run(client, prompt="urgent", max_tokens=4)
            progress = openai.batches.retrieve(batch.id).request_counts
            running = _lines(client, batch.id, "running")
            ahead_now = [client.get(f"/v1/jobs/{line['id']}").json() for line in ahead]
        finally:
            openai.batches.cancel(batch.id)
    assert job["status"] == "succeeded"
    assert job["priority"] == 0
    assert progress is not None
    assert progress.completed < count  # the batch was still going
    assert running
    assert {line["priority"] for line in running} == {3}
    # Every line claimed before the job was submitted is still running, or ended after it.
    job_ended = datetime.fromisoformat(job["finished_at"])
    assert [
        line["id"]
        for line in ahead_now
        if line["finished_at"] is not None
        and datetime.fromisoformat(line["finished_at"]) <= job_ended
    ] == []


def _lines(client: httpx.Client, batch_id: str, status: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = None
    while True:
        params: dict[str, str | int] = {"batch_id": batch_id, "status": status, "limit": 100}
        if after is not None:
            params["after"] = after
        page = client.get("/v1/jobs", params=params)
        body = page.json()
        found += body["data"]
        if not body["has_more"]:
            return found
        after = body["last_id"]


def test_priority_is_kept_on_the_job_and_bounded(stack: Stack) -> None:
    with stack.client() as client:
        job = run(client, prompt="later", max_tokens=2, priority=MAX_PRIORITY)
        assert job["priority"] == MAX_PRIORITY
        for bad in (-1, MAX_PRIORITY + 1, "high"):
            refused = client.post("/v1/jobs", json={"prompt": "x", "priority": bad})
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"]["param"] == "priority"
    with client_for(stack) as openai, pytest.raises(Exception, match="priority"):
        openai.batches.create(
            input_file_id=upload(openai, [chat_line(0)]),
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"priority": MAX_PRIORITY + 1},
        )
