"""Idempotency-Key on POST /v1/jobs, through the real API and Postgres."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from sqlalchemy import func, select

from inferq.store.models import JobRow
from tests.conftest import Stack

pytestmark = pytest.mark.engine


def _jobs_with(stack: Stack, marker: str) -> int:
    with stack.sessions() as session:
        query = (
            select(func.count())
            .select_from(JobRow)
            .where(JobRow.metadata_["marker"].as_string() == marker)
        )
        return int(session.scalar(query) or 0)


def test_50_concurrent_identical_submissions_create_one_job(stack: Stack) -> None:
    marker = uuid.uuid4().hex
    body = {"prompt": "once", "max_tokens": 4, "metadata": {"marker": marker}}
    headers = {"Idempotency-Key": f"key-{marker}"}

    async def fire() -> list[tuple[int, str | None]]:
        async with stack.async_client() as client:
            responses = await asyncio.gather(
                *(client.post("/v1/jobs", json=body, headers=headers) for _ in range(50))
            )
        return [(r.status_code, r.json().get("id")) for r in responses]

    results = asyncio.run(fire())
    assert _jobs_with(stack, marker) == 1
    accepted = {job_id for status, job_id in results if status == 202}
    assert len(accepted) == 1
    assert {status for status, _ in results} <= {202, 409}
    # Once the first is answered, every retry gets its response.
    with stack.client() as client:
        again = client.post("/v1/jobs", json=body, headers=headers)
    assert again.status_code == 202
    assert again.json()["id"] in accepted
    assert again.headers["idempotent-replayed"] == "true"
    assert again.json()["status"] == "queued"  # the first response, as it was


def test_a_key_reused_with_another_body_is_refused(stack: Stack) -> None:
    marker = uuid.uuid4().hex
    headers = {"Idempotency-Key": marker}
    with stack.client() as client:
        first = client.post("/v1/jobs", json={"prompt": "a", "max_tokens": 1}, headers=headers)
        other = client.post("/v1/jobs", json={"prompt": "b", "max_tokens": 1}, headers=headers)
    assert first.status_code == 202
    assert other.status_code == 422
    assert "different request" in other.json()["error"]["message"]


def test_keys_are_scoped_per_api_key(stack: Stack) -> None:
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    body = {"prompt": "same", "max_tokens": 1}
    with stack.client(stack.new_key()) as alice, stack.client(stack.new_key()) as bob:
        first = alice.post("/v1/jobs", json=body, headers=headers).json()
        second = bob.post("/v1/jobs", json=body, headers=headers).json()
    assert first["id"] != second["id"]


def test_a_refused_request_does_not_use_up_its_key(stack: Stack) -> None:
    headers = {"Idempotency-Key": uuid.uuid4().hex}
    with stack.client() as client:
        bad = client.post("/v1/jobs", json={"prompt": "x", "temperature": 9}, headers=headers)
        good = client.post("/v1/jobs", json={"prompt": "x", "max_tokens": 1}, headers=headers)
    assert bad.status_code == 422
    assert good.status_code == 202
