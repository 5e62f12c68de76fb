"""Single jobs end to end: API (uvicorn) → Redis → GPU worker (Celery + vLLM on CPU) →
Postgres, all real processes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from inferq.store.models import JobRow
from tests.conftest import ADMIN_KEY, Stack
from tests.helpers.broker import Broker
from tests.helpers.metrics import Delta, engine_settled
from tests.helpers.processes import ENGINE_CORE_HERE
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine

TERMINAL = {"succeeded", "failed", "cancelled"}
# The longest wait the API allows by default (INFERQ_MAX_WAIT_S).
LONG_POLL_S = 120


def submit(client: httpx.Client, **body: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    job: dict[str, Any] = response.json()
    assert response.headers["location"] == job["url"] == f"/v1/jobs/{job['id']}"
    return job


def wait_done(client: httpx.Client, job_id: str, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", params={"wait": 30}).json()
        if job["status"] in TERMINAL:
            return job
    raise AssertionError(f"job {job_id} did not finish in {timeout_s} s")


def run(client: httpx.Client, **body: Any) -> dict[str, Any]:
    return wait_done(client, submit(client, **body)["id"])


def count_jobs(stack: Stack) -> int:
    with stack.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(JobRow)) or 0)


def test_a_completion_job_returns_the_models_own_greedy_text(
    stack: Stack, tiny_model: Path
) -> None:
    prompts = ["The quick brown fox", "Once upon a time"]
    with stack.client() as client:
        jobs = [run(client, prompt=p, max_tokens=24, temperature=0) for p in prompts]
    for job in jobs:
        assert job["status"] == "succeeded", job
        [choice] = job["choices"]
        assert choice["finish_reason"] in {"stop", "length"}
        assert job["usage"]["completion_tokens"] == choice["completion_tokens"] > 0
        assert (
            job["usage"]["total_tokens"]
            == job["usage"]["prompt_tokens"] + choice["completion_tokens"]
        )
        assert job["started_at"] is not None
        assert job["created_at"] <= job["started_at"] <= job["finished_at"]
        assert job["attempts"] == 1
    # The same prompts straight through vLLM's LLM.generate give the same text.
    reference = subprocess.run(
        [sys.executable, "-m", "tests.helpers.reference", str(tiny_model), "24", *prompts],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        env={**os.environ, **ENGINE_CORE_HERE},
    )
    line = next(x for x in reference.stdout.splitlines() if x.startswith("REFERENCE "))
    assert [job["choices"][0]["text"] for job in jobs] == json.loads(
        line.removeprefix("REFERENCE ")
    )


def test_a_chat_job_uses_the_chat_template(stack: Stack) -> None:
    with stack.client() as client:
        chat = run(
            client,
            messages=[{"role": "user", "content": "Hello world"}],
            max_tokens=16,
            temperature=0,
        )
        raw = run(client, prompt="Hello world", max_tokens=16, temperature=0)
    assert chat["status"] == "succeeded"
    assert chat["choices"][0]["text"]
    # The template wraps the message in headers: more prompt tokens than the raw text.
    assert chat["usage"]["prompt_tokens"] > raw["usage"]["prompt_tokens"] + 5


def test_max_tokens_is_honoured(stack: Stack) -> None:
    with stack.client() as client:
        job = run(client, prompt="Count:", max_tokens=7, ignore_eos=True)
    assert job["choices"][0]["completion_tokens"] == 7
    assert job["choices"][0]["finish_reason"] == "length"


def test_generation_ends_at_a_stop_string(stack: Stack) -> None:
    with stack.client() as client:
        free = run(client, prompt="Translate to French:", max_tokens=40, temperature=0)
        text = free["choices"][0]["text"]
        # A stop string taken from the middle of what the model says unprompted.
        start = next(
            i
            for i in range(8, len(text) - 2)
            if text[i : i + 2].isascii() and text[i : i + 2].isalnum()
        )
        stop = text[start : start + 2]
        stopped = run(
            client, prompt="Translate to French:", max_tokens=40, temperature=0, stop=[stop]
        )
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["text"] == text[: text.index(stop)]


def test_the_same_seed_gives_the_same_text(stack: Stack) -> None:
    body = {"prompt": "Hello world", "max_tokens": 24, "temperature": 1.0}
    with stack.client() as client:
        first = run(client, seed=7, **body)
        again = run(client, seed=7, **body)
        other = run(client, seed=8, **body)
    assert first["choices"][0]["text"] == again["choices"][0]["text"]
    assert first["choices"][0]["text"] != other["choices"][0]["text"]


def test_n_completions_and_logprobs(stack: Stack) -> None:
    with stack.client() as client:
        job = run(client, prompt="Hello", max_tokens=5, n=2, logprobs=2, seed=1, ignore_eos=True)
    assert [c["index"] for c in job["choices"]] == [0, 1]
    for choice in job["choices"]:
        assert len(choice["logprobs"]) == 5
        for token in choice["logprobs"]:
            assert token["logprob"] <= 0
            assert len(token["top_logprobs"]) == 2
    assert job["usage"]["completion_tokens"] == 10


def test_300_concurrent_jobs_all_succeed_exactly_once(stack: Stack) -> None:
    async def one(client: httpx.AsyncClient, i: int) -> str:
        response = await client.post("/v1/jobs", json={"prompt": f"job {i}", "max_tokens": 16})
        assert response.status_code == 202, response.text
        return str(response.json()["id"])

    async def submit_all() -> list[str]:
        async with stack.async_client(limits=httpx.Limits(max_connections=50)) as client:
            return await asyncio.gather(*(one(client, i) for i in range(300)))

    ids = asyncio.run(submit_all())
    assert len(set(ids)) == 300
    with stack.client() as client:
        jobs = [wait_done(client, job_id) for job_id in ids]
    assert [j["status"] for j in jobs] == ["succeeded"] * 300
    assert all(j["attempts"] == 1 for j in jobs)
    stored = stack.store.get_jobs(ids)
    assert len(stored) == 300
    assert all(j.result is not None and len(j.result.choices) == 1 for j in stored)


def test_a_long_poll_answers_as_soon_as_the_job_ends(stack: Stack) -> None:
    with stack.client() as client:
        job = submit(client, prompt="Hello", max_tokens=8)
        started = time.monotonic()
        done = client.get(
            f"/v1/jobs/{job['id']}", params={"wait": LONG_POLL_S}, timeout=2 * LONG_POLL_S
        )
        elapsed = time.monotonic() - started
    assert done.json()["status"] == "succeeded"
    # Answered when the job ended (seconds), not when the wait ran out: a poll that sleeps
    # to its end would take all of it however slow the machine.
    assert elapsed < LONG_POLL_S / 2


def test_a_submission_that_waits_gets_its_result_or_a_202_for_a_job_left_to_run(
    stack: Stack,
) -> None:
    with stack.client() as client:
        answered = client.post(
            "/v1/jobs", params={"wait": 60}, json={"prompt": "Hello", "max_tokens": 8}
        )
        assert answered.status_code == 200, answered.text
        job = answered.json()
        assert job["status"] == "succeeded"
        assert job["usage"]["completion_tokens"] >= 1
        assert answered.headers["Location"] == f"/v1/jobs/{job['id']}"
        assert client.get(f"/v1/jobs/{job['id']}").json() == job
        # With the worker stopped the job cannot end within the wait: 202, and once the
        # worker goes on, the job runs to its end.
        long_job = {"prompt": "Hello", "max_tokens": 300, "ignore_eos": True}
        with stack.worker.frozen():
            pending = client.post("/v1/jobs", params={"wait": 0.05}, json=long_job)
        assert pending.status_code == 202, pending.text
        assert pending.json()["status"] in ("queued", "running")
        ended = wait_done(client, pending.json()["id"])
        assert ended["status"] == "succeeded"
        assert ended["usage"]["completion_tokens"] == 300
        refused = client.post("/v1/jobs", params={"wait": -1}, json=long_job)
        assert refused.status_code == 422


def test_a_cancelled_queued_job_never_runs(stack: Stack, broker: Broker) -> None:
    engine = Delta(stack.worker.metrics_url)
    with stack.client() as client:
        # The worker finishes about five of these a second; submitting them is several times
        # faster, so the queue in front of the victim only grows while they go in.
        blockers = [
            submit(client, prompt=f"block {i}", max_tokens=900, ignore_eos=True)["id"]
            for i in range(150)
        ]
        victim = submit(client, prompt="never", max_tokens=8)["id"]
        cancelled = client.post(f"/v1/jobs/{victim}/cancel")
        assert cancelled.status_code == 200, cancelled.text
        assert cancelled.json()["status"] == "cancelled"
        _cancel_all(stack, blockers)
        # A job submitted after the victim finishing means the victim's message was taken;
        # once it is acknowledged, the worker is done with it: it can no longer run.
        after = run(client, prompt="after", max_tokens=4)
        assert after["status"] == "succeeded"
        broker.wait_gpu_messages_done({victim, *blockers, after["id"]}, timeout_s=60)
        victim_job = client.get(f"/v1/jobs/{victim}").json()
    wait_until(lambda: engine_settled(engine), timeout_s=30, what="the engine empty")
    assert victim_job["status"] == "cancelled"
    assert victim_job["attempts"] == 0
    assert victim_job["started_at"] is None
    assert victim_job["choices"] is None
    # The blockers running when they were cancelled were aborted in the engine, not left
    # to generate their 900 tokens.
    assert engine("inferq_jobs_finished_total", outcome="aborted", reason="cancelled") >= 1


def _cancel_all(stack: Stack, job_ids: list[str]) -> None:
    async def cancel_all() -> None:
        async with stack.async_client() as client:
            await asyncio.gather(*(client.post(f"/v1/jobs/{j}/cancel") for j in job_ids))

    asyncio.run(cancel_all())


def test_a_finished_job_cannot_be_cancelled(stack: Stack) -> None:
    with stack.client() as client:
        job = run(client, prompt="Hello", max_tokens=2)
        response = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert response.status_code == 409
    assert "already succeeded" in response.json()["error"]["message"]


BAD_REQUESTS = [
    ({"prompt": "hi", "temperature": 3}, "temperature", "less than or equal to 2"),
    ({"prompt": "hi", "max_tokens": 5000}, "max_tokens", "context of 1024 tokens"),
    ({"prompt": "hi " * 3000}, "prompt", "context of 1024 tokens"),
    ({"prompt": "hi", "logit_bias": {"9999": 1}}, "logit_bias", "outside this model's vocab"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role", "Input should be"),
    ({"prompt": "hi", "messages": [{"role": "user", "content": "x"}]}, "prompt", "exactly one"),
    ({"max_tokens": 4}, "prompt", "exactly one"),
    ({"prompt": "hi", "n": 0}, "n", "greater than or equal to 1"),
    ({"prompt": "hi", "top_k": 2**64 + 1}, "top_k", "less than or equal to 2147483647"),
    ({"prompt": "hi", "stop": ["a"] * 17}, "stop", "at most 16"),
    ({"prompt": "hi", "webhook_events": None}, "webhook_events", "leave the field out"),
    ({"prompt": "hi", "webhook_events": ["job.done"]}, "webhook_events.0", "Input should be"),
    ({"prompt": "hi", "webhook_events": ["job.failed"]}, "webhook_events", "needs a webhook_url"),
]


@pytest.mark.parametrize(("body", "param", "message"), BAD_REQUESTS)
def test_a_bad_request_is_refused_with_a_clear_422_and_writes_nothing(
    stack: Stack, body: dict[str, Any], param: str, message: str
) -> None:
    before = count_jobs(stack)
    with stack.client() as client:
        response = client.post("/v1/jobs", json=body)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["param"] == param
    assert message in error["message"]
    assert count_jobs(stack) == before


@pytest.mark.parametrize(
    "path", ["/v1/jobs?after=job_%00", "/v1/batches?after=%F0%93%A8%80%00", "/v1/jobs/job_%00x"]
)
def test_a_nul_character_in_the_url_is_a_422(stack: Stack, path: str) -> None:
    with stack.client() as client:
        response = client.get(path)
    assert response.status_code == 422
    assert "NUL character" in response.json()["error"]["message"]


def test_malformed_json_is_a_422(stack: Stack) -> None:
    with stack.client() as client:
        response = client.post(
            "/v1/jobs", content=b"{not json", headers={"content-type": "application/json"}
        )
    assert response.status_code == 422
    assert "JSON" in response.json()["error"]["message"]


def test_listing_filters_by_status_and_pages(stack: Stack) -> None:
    with stack.client() as client:
        ids = [run(client, prompt=f"list {i}", max_tokens=2)["id"] for i in range(3)]
        first = client.get("/v1/jobs", params={"status": "succeeded", "limit": 2}).json()
        assert first["has_more"]
        assert [j["status"] for j in first["data"]] == ["succeeded", "succeeded"]
        assert [j["id"] for j in first["data"]] == ids[::-1][:2]
        rest = client.get(
            "/v1/jobs", params={"status": "succeeded", "limit": 100, "after": first["last_id"]}
        ).json()
        assert rest["data"][0]["id"] == ids[0]
        bad = client.get("/v1/jobs", params={"status": "weird"})
        assert bad.status_code == 422


def test_unknown_jobs_are_404_and_long_waits_are_cut_short(stack: Stack) -> None:
    with stack.client() as client:
        missing = client.get("/v1/jobs/job_nope")
        assert missing.status_code == 404
        assert "job_nope" in missing.json()["error"]["message"]
        assert client.post("/v1/jobs/job_nope/cancel").status_code == 404
        job = run(client, prompt="x", max_tokens=1)
        # A wait longer than the server allows is cut short, not refused.
        long_wait = client.get(f"/v1/jobs/{job['id']}", params={"wait": 100_000})
        assert long_wait.status_code == 200
        assert client.get(f"/v1/jobs/{job['id']}", params={"wait": -1}).status_code == 422


def test_health_readiness_and_docs(stack: Stack) -> None:
    with stack.client() as client:
        assert client.get("/healthz").json() == {"status": "ok", "checks": {}}
        ready = client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["checks"] == {"postgres": "ok", "redis": "ok"}
        assert client.get("/docs").status_code == 200
        paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/cancel"} <= set(paths)


def test_the_cli_submits_and_prints_the_result(stack: Stack) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "cli.main",
            "submit",
            "Hello world",
            "--wait",
            "--max-tokens",
            "12",
            "--seed",
            "3",
            "--url",
            stack.url,
        ],
        env={**os.environ, "INFERQ_API_KEY": ADMIN_KEY},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    with stack.client() as client:
        latest = client.get("/v1/jobs", params={"limit": 1}).json()["data"][0]
    assert latest["params"]["seed"] == 3
    assert result.stdout == latest["choices"][0]["text"] + "\n"
