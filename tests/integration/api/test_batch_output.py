"""`GET /v1/batches/{id}/output`: a batch's results read while it runs, against a running
inferq (API, GPU worker with vLLM on CPU, maintenance worker, Redis, Postgres)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import select

from inferq.store.models import JobRow
from tests.conftest import ADMIN_KEY, Stack
from tests.helpers.waiting import wait_until
from tests.integration.api.test_batches import (
    chat_line,
    client_for,
    read_lines,
    upload,
    wait_for,
)

pytestmark = pytest.mark.engine

# The quick lines end at once; the slow ones run near the context (1024 tokens), far more
# of them than the engine holds (16), so the batch runs until it is cancelled.
QUICK = 5
SLOW = 100


@dataclass
class Partial:
    lines: list[dict[str, Any]]
    cursor: int
    ended: bool
    asked_at: datetime


def read_output(
    http: httpx.Client, batch_id: str, *, after: int | None = None, errors: bool = False
) -> Partial:
    params: dict[str, str | int] = {} if after is None else {"after": after}
    if errors:
        params["include"] = "errors"
    asked_at = datetime.now(UTC)
    response = http.get(f"/v1/batches/{batch_id}/output", params=params)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.headers["inferq-batch-ended"] in {"true", "false"}
    return Partial(
        lines=[json.loads(line) for line in response.text.splitlines()],
        cursor=int(response.headers["inferq-next-cursor"]),
        ended=response.headers["inferq-batch-ended"] == "true",
        asked_at=asked_at,
    )


def running_batch(stack: Stack, key: str = ADMIN_KEY) -> str:
    """A batch whose first QUICK lines end at once and whose SLOW others run until it is
    cancelled. Line n (they count from 1) has custom_id req-(n-1)."""
    client = client_for(stack, key)
    lines = [chat_line(i, max_tokens=4) for i in range(QUICK)] + [
        chat_line(i, max_tokens=900, ignore_eos=True) for i in range(QUICK, QUICK + SLOW)
    ]
    return client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    ).id


def quick_lines_ended(http: httpx.Client, batch_id: str) -> Partial:
    return wait_until(
        lambda: (part := read_output(http, batch_id)).cursor >= QUICK and part,
        timeout_s=120,
        what="the quick lines ended",
    )


def custom_ids(lines: list[dict[str, Any]]) -> list[str]:
    return [line["custom_id"] for line in lines]


def input_order(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(lines, key=lambda line: int(line["custom_id"].removeprefix("req-")))


def test_lines_are_read_while_the_batch_runs_none_missed_or_repeated(stack: Stack) -> None:
    client = client_for(stack)
    batch_id = running_batch(stack)
    with stack.client() as http:
        first = quick_lines_ended(http, batch_id)
        # The worker (and its engine) frozen until the batch is cancelled: however quick
        # the machine, the slow lines are still running when it is.
        with stack.worker.frozen():
            second = _read_while_running(stack, http, client, batch_id, first)
        rest: list[dict[str, Any]] = []
        cursor = second.cursor

        def read_on() -> bool:
            nonlocal cursor
            part = read_output(http, batch_id, after=cursor, errors=True)
            assert part.cursor >= cursor
            rest.extend(part.lines)
            cursor = part.cursor
            return part.ended

        wait_until(read_on, timeout_s=60, what="every line ended")
        assert cursor == QUICK + SLOW
        assert "batch_cancelled" in {line["error"]["code"] for line in rest if line["error"]}
        again = read_output(http, batch_id, after=cursor, errors=True)
        assert (again.lines, again.cursor, again.ended) == ([], cursor, True)

        batch = wait_for(client, batch_id)
        final = input_order(
            read_lines(client, batch.output_file_id) + read_lines(client, batch.error_file_id)
        )
        read = first.lines + second.lines + rest
        assert custom_ids(read) == [f"req-{i}" for i in range(QUICK + SLOW)]
        assert read == final
        # From the start, with errors: the two files interleaved; without: the output file.
        assert read_output(http, batch_id, errors=True).lines == final
        assert read_output(http, batch_id).lines == read_lines(client, batch.output_file_id)


def _read_while_running(
    stack: Stack, http: httpx.Client, client: OpenAI, batch_id: str, first: Partial
) -> Partial:
    """Check what was read of the running batch, read on from its cursor, then cancel it."""
    assert not first.ended
    assert QUICK <= first.cursor < QUICK + SLOW
    # Every line up to the cursor has ended and is here; the next had not ended.
    assert custom_ids(first.lines) == [f"req-{i}" for i in range(first.cursor)]
    assert all(line["error"] is None for line in first.lines)
    with stack.sessions() as session:
        next_finished = session.scalar(
            select(JobRow.finished_at).where(
                JobRow.batch_id == batch_id, JobRow.line == first.cursor + 1
            )
        )
    assert next_finished is None or next_finished >= first.asked_at

    second = read_output(http, batch_id, after=first.cursor)
    assert second.cursor >= first.cursor
    assert custom_ids(second.lines) == [f"req-{i}" for i in range(first.cursor, second.cursor)]

    cancelled = client.batches.cancel(batch_id)
    assert cancelled.status in {"cancelling", "cancelled"}
    return second


def test_an_unknown_or_foreign_batch_is_not_found_and_a_bad_query_is_refused(
    stack: Stack,
) -> None:
    owner_key, stranger_key = stack.new_key(), stack.new_key()
    owner = client_for(stack, owner_key)
    batch = owner.batches.create(
        input_file_id=upload(owner, [chat_line(0, max_tokens=2)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    output = f"/v1/batches/{batch.id}/output"
    with stack.client(owner_key) as http:
        assert http.get(output).status_code == 200
        assert http.get("/v1/batches/batch_nothing/output").status_code == 404
        assert http.get(output, params={"after": -1}).status_code == 422
        assert http.get(output, params={"after": "first"}).status_code == 422
        assert http.get(output, params={"include": "everything"}).status_code == 422
    with stack.client(stranger_key) as http:
        refused = http.get(output)
        assert refused.status_code == 404
        assert batch.id in refused.json()["error"]["message"]
    wait_for(owner, batch.id)
