"""Batch work shared between tenants, through the real stack with the `openai` client: a
small batch is not held behind another tenant's big one, a tenant's urgent batch
overtakes its own less urgent one, weights set the shares, and a big batch still ends
with every line, in input order."""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime

import pytest
from openai import OpenAI
from sqlalchemy import select

from inferq.store.models import JobRow
from tests.conftest import Stack
from tests.integration.api.test_batches import chat_line, client_for, read_lines, upload, wait_for

pytestmark = pytest.mark.engine


def _create(client: OpenAI, lines: int, *, tag: str, priority: int = 0) -> str:
    file_id = upload(client, [chat_line(i, max_tokens=8, ignore_eos=True) for i in range(lines)])
    return client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"tag": tag},
        extra_body={"priority": priority},
    ).id


def _completed(client: OpenAI, batch_id: str) -> int:
    counts = client.batches.retrieve(batch_id).request_counts
    assert counts is not None
    return counts.completed


def _wait_running(client: OpenAI, batch_id: str, timeout_s: float = 120) -> None:
    """Until some of its lines have ended: it holds the engine."""
    deadline = time.monotonic() + timeout_s
    while _completed(client, batch_id) == 0:
        assert time.monotonic() < deadline, f"batch {batch_id} never started"
        time.sleep(0.05)


def test_a_small_batch_is_not_held_behind_another_tenants_big_one(stack: Stack) -> None:
    big_tenant = client_for(stack, stack.new_key())
    small_tenant = client_for(stack, stack.new_key())
    big = _create(big_tenant, 800, tag="big")
    _wait_running(big_tenant, big)

    small = _create(small_tenant, 40, tag="small")
    assert wait_for(small_tenant, small).status == "completed"
    # Half the room each from the small batch's first claim: it ended while the big one
    # had most of its lines to go (first in, first out, it would have waited for all).
    done_then = _completed(big_tenant, big)
    assert done_then < 400, f"the big batch had {done_then} of 800 lines done"

    finished = wait_for(big_tenant, big)
    assert finished.status == "completed"
    output = read_lines(big_tenant, finished.output_file_id)
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(800)]
    assert all(line["response"]["status_code"] == 200 for line in output)


def test_a_tenants_urgent_batch_overtakes_its_less_urgent_one(stack: Stack) -> None:
    client = client_for(stack, stack.new_key())
    later = _create(client, 600, tag="later", priority=9)
    _wait_running(client, later)

    urgent = _create(client, 40, tag="urgent", priority=0)
    assert wait_for(client, urgent).status == "completed"
    done_then = _completed(client, later)
    # Its lines went first from the next claim on: only what was held already ran.
    assert done_then < 300, f"the priority-9 batch had {done_then} of 600 lines done"
    assert wait_for(client, later).status == "completed"


def test_weights_share_the_lines_between_tenants(stack: Stack) -> None:
    light_secret, heavy_secret = stack.new_key(), stack.new_key()
    heavy_key = stack.keys.find(heavy_secret)
    assert heavy_key is not None
    with stack.client() as admin:
        changed = admin.patch(f"/v1/admin/keys/{heavy_key.id}", json={"weight": 3})
        assert changed.status_code == 200, changed.text
        assert changed.json()["weight"] == 3
    light, heavy = client_for(stack, light_secret), client_for(stack, heavy_secret)
    light_batch = _create(light, 300, tag="light")
    heavy_batch = _create(heavy, 300, tag="heavy")
    assert wait_for(heavy, heavy_batch).status == "completed"
    assert wait_for(light, light_batch).status == "completed"

    # The window: from the heavy batch's first claim to its last, while both had lines
    # waiting. Lines are counted by when they were claimed (a claim stamps its lines).
    starts = _claimed_at(stack, [light_batch, heavy_batch])
    window = (min(starts[heavy_batch]), max(starts[heavy_batch]))
    shares = Counter(
        batch_id
        for batch_id, times in starts.items()
        for at in times
        if window[0] <= at <= window[1]
    )
    ratio = shares[heavy_batch] / shares[light_batch]
    assert 2.5 <= ratio <= 3.5, f"{shares[heavy_batch]} : {shares[light_batch]} lines"


def _claimed_at(stack: Stack, batch_ids: list[str]) -> dict[str, list[datetime]]:
    with stack.sessions() as session:
        rows = session.execute(
            select(JobRow.batch_id, JobRow.started_at).where(JobRow.batch_id.in_(batch_ids))
        ).all()
    found: dict[str, list[datetime]] = {batch_id: [] for batch_id in batch_ids}
    for batch_id, started_at in rows:
        found[batch_id].append(started_at)
    return found
