"""Priorities: single jobs first inside the engine, and the `priority` field on jobs and
batches. Real API, worker and vLLM on the CPU."""

from __future__ import annotations

import time

import pytest

from inferq.jobs import MAX_PRIORITY
from tests.conftest import Stack
from tests.integration.test_batches import chat_line, client_for, upload
from tests.integration.test_jobs_end_to_end import run

pytestmark = pytest.mark.engine

# The shared stack's worker runs 16 batch lines at once (INFERQ_MAX_NUM_SEQS), keeps
# 16 / 8 = 2 more engine slots for single jobs, and holds 18 + 8 Celery messages at once;
# a batch chunk is 8 lines (INFERQ_MAX_BATCH_SIZE).
BATCH_SLOTS = 16
MESSAGE_SLOTS = 26
CHUNK_LINES = 8


def test_a_single_job_overtakes_an_engine_full_of_batch_lines(stack: Stack) -> None:
    openai = client_for(stack)
    # Long lines: each runs for seconds, far longer than the single job below. More chunks
    # than the worker has message slots, so the job's own message waits behind them in
    # Redis: it gets in by the offer of its id (pub/sub), then into a slot kept for it.
    count = (MESSAGE_SLOTS + 4) * CHUNK_LINES
    lines = [chat_line(i, max_tokens=700, ignore_eos=True) for i in range(count)]
    batch = openai.batches.create(
        input_file_id=upload(openai, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"priority": 3},
    )
    assert batch.model_extra is not None
    assert batch.model_extra["priority"] == 3
    with stack.client() as client:

        def lines_in(status: str) -> list[dict[str, object]]:
            page = client.get(
                "/v1/jobs", params={"batch_id": batch.id, "status": status, "limit": 100}
            )
            data: list[dict[str, object]] = page.json()["data"]
            return data

        try:
            deadline = time.monotonic() + 120
            while len(lines_in("running")) < BATCH_SLOTS:
                assert time.monotonic() < deadline, "the batch never filled the engine"
                time.sleep(0.1)
            job = run(client, prompt="urgent", max_tokens=4)
            finished_lines = lines_in("succeeded")
            running = lines_in("running")
        finally:
            openai.batches.cancel(batch.id)
    assert job["status"] == "succeeded"
    assert job["priority"] == 0
    # It went into a slot kept for single jobs instead of waiting for a line to end.
    assert finished_lines == []
    assert len(running) >= BATCH_SLOTS
    assert {line["priority"] for line in running} == {3}


def test_priority_is_kept_on_the_job_and_bounded(stack: Stack) -> None:
    with stack.client() as client:
        job = run(client, prompt="later", max_tokens=2, priority=MAX_PRIORITY)
        assert job["priority"] == MAX_PRIORITY
        for bad in (-1, MAX_PRIORITY + 1, "high"):
            refused = client.post("/v1/jobs", json={"prompt": "x", "priority": bad})
            assert refused.status_code == 422, refused.text
            assert refused.json()["error"]["param"] == "priority"
    openai = client_for(stack)
    with pytest.raises(Exception, match="priority"):
        openai.batches.create(
            input_file_id=upload(openai, [chat_line(0)]),
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"priority": MAX_PRIORITY + 1},
        )
