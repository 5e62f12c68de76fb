"""What operators see: Prometheus metrics after real jobs, /v1/status, and a cancel that
reaches the engine."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferq.host.processes import descendants
from tests.conftest import ADMIN_KEY, Stack, new_key_prefix
from tests.helpers.databases import cloned_database
from tests.helpers.metrics import Delta, scrape, value
from tests.helpers.models import register_model
from tests.helpers.processes import free_port, start_api, thread_nices
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine

ABORTED = {"outcome": "aborted", "reason": "cancelled"}


def run_jobs(stack: Stack, count: int, tokens: int) -> list[dict[str, object]]:
    with stack.client() as client:
        ids = [
            client.post(
                "/v1/jobs", json={"prompt": f"m{i}", "max_tokens": tokens, "ignore_eos": True}
            ).json()["id"]
            for i in range(count)
        ]
        return [client.get(f"/v1/jobs/{i}", params={"wait": 60}).json() for i in ids]


def test_worker_metrics_count_the_jobs_that_ran(stack: Stack) -> None:
    delta = Delta(stack.worker.metrics_url)
    jobs = run_jobs(stack, 6, 11)
    # A job's latency is observed last, after its commit (which is what the API answers
    # from), so once all six are there every other series has them too.
    wait_until(
        lambda: delta.rescrape()("inferq_job_latency_seconds_count") >= 6,
        timeout_s=30,
        what="six latencies observed",
    )
    after = delta.after

    assert all(j["status"] == "succeeded" for j in jobs)
    assert delta("inferq_jobs_admitted_total") == 6
    assert delta("inferq_jobs_finished_total", outcome="succeeded", reason="length") == 6
    assert delta("inferq_generation_tokens_total") == 66
    prompt_tokens = sum(j["usage"]["prompt_tokens"] for j in jobs)  # type: ignore[index]
    assert delta("inferq_prompt_tokens_total") == prompt_tokens
    assert delta("inferq_job_latency_seconds_count") == 6
    assert delta("inferq_queue_wait_seconds_count") == 6
    assert value(after, "inferq_worker_ready") == 1
    assert 0 <= value(after, "inferq_kv_cache_usage_ratio") <= 1
    # vLLM's own series are served beside inferq's.
    assert any(name.startswith("vllm:") for name, _ in after)
    # No GPU here: no GPU series, and no error.
    assert not any(name.startswith("inferq_gpu_") for name, _ in after)


def test_the_engine_yields_the_cores_to_the_pipeline_when_asked(stack: Stack) -> None:
    """With `INFERQ_ENGINE_NICE=19` (the shared stack's), vLLM's engine processes, every
    thread of theirs, run at nice 19 (on a CPU they spin on the cores the API, Redis and
    Postgres need); the worker's own process keeps its priority. Threads started after the
    worker was ready (the engine's for the jobs here) inherit it."""
    run_jobs(stack, 2, 4)
    engine = [
        pid
        for pid in descendants(stack.worker.pid)
        if Path(f"/proc/{pid}/comm").read_text().startswith("VLLM::")
    ]
    assert len(engine) >= 2, "vLLM on the CPU runs its engine core and its model apart"
    assert {pid: thread_nices(pid) for pid in engine} == {pid: {19} for pid in engine}
    assert thread_nices(stack.worker.pid) == {0}


def test_api_metrics_count_requests_by_route_and_show_queue_depths(stack: Stack) -> None:
    url = stack.url + "/metrics"
    before = scrape(url)
    run_jobs(stack, 3, 2)
    with stack.client() as client:
        assert client.get("/v1/jobs/job_missing").status_code == 404
    after = scrape(url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("inferq_api_requests_total", method="POST", route="/v1/jobs", status="202") == 3
    assert (
        delta("inferq_api_requests_total", method="GET", route="/v1/jobs/{job_id}", status="404")
        == 1
    )
    assert delta("inferq_api_request_duration_seconds_count", method="POST", route="/v1/jobs") == 3
    assert ("inferq_queue_depth", (("queue", "interactive:tiny"),)) in after
    assert value(after, "inferq_workers_online") == 1
    assert value(after, "inferq_model_workers_online", model="tiny") == 1


def test_status_shows_the_running_worker_and_its_throughput(stack: Stack) -> None:
    run_jobs(stack, 4, 8)

    with stack.client() as client:

        def counted() -> dict[str, Any] | None:
            """The status, once a heartbeat (one every few seconds) counts the four jobs."""
            status: dict[str, Any] = client.get("/v1/status").json()
            return status if any(w["jobs_per_s"] * 60 >= 4 for w in status["workers"]) else None

        status = wait_until(counted, timeout_s=30, what="a heartbeat that counts the jobs")
    [worker] = status["workers"]
    assert worker["name"] == "worker@test"
    assert worker["model"] == "tiny"
    assert worker["gpus"] == []
    assert worker["jobs_per_s"] > 0
    assert worker["stuck"] is None
    assert status["tokens_per_s"] > 0
    assert set(status["queues"]) == {"interactive:tiny", "bulk:tiny"}
    assert status["models"] == [
        {"name": "tiny", "base": "tiny", "runner": "generate", "workers": ["worker@test"]}
    ]


def test_status_shows_queue_depth_and_logs_can_be_json(
    stack: Stack, tmp_path: Path, pg_template: str, tiny_model: Path
) -> None:
    with cloned_database(pg_template) as database_url:
        # A model once registered whose worker is gone: its jobs are accepted and wait.
        register_model(database_url, tiny_model)
        # No worker reads this key space: what is submitted stays queued.
        env = {
            **stack.env,
            "INFERQ_DATABASE_URL": database_url,
            "INFERQ_REDIS_KEY_PREFIX": new_key_prefix(),
            "INFERQ_LOG_JSON": "true",
        }
        port = free_port()
        api = start_api(env=env, port=port, log_dir=tmp_path)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
                ids = [
                    client.post("/v1/jobs", json={"prompt": "x", "max_tokens": 1}).json()["id"]
                    for _ in range(3)
                ]
                status = client.get("/v1/status").json()
        finally:
            api.stop()
    assert status["queues"] == {"interactive:tiny": 3, "bulk:tiny": 0}
    assert status["workers"] == []
    assert status["models"][0]["workers"] == []
    assert status["jobs_per_s"] == 0
    records = [json.loads(line) for line in api.log_path.read_text().splitlines() if line.strip()]
    assert {r["job_id"] for r in records if "job_id" in r} == set(ids)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["logger"] == "uvicorn.access" for r in records)


def test_a_cancel_aborts_a_running_job_in_the_engine(stack: Stack) -> None:
    body = {"prompt": "long", "max_tokens": 1000, "ignore_eos": True, "n": 4}
    with stack.client() as client:

        def status(job_id: str) -> str:
            found: str = client.get(f"/v1/jobs/{job_id}").json()["status"]
            return found

        for _ in range(3):
            delta = Delta(stack.worker.metrics_url)
            job = client.post("/v1/jobs", json=body).json()
            wait_until(
                lambda job_id=job["id"]: status(job_id) != "queued", timeout_s=30, what="taken"
            )
            # The worker (and its engine) frozen while the cancel lands, so the job cannot
            # end meanwhile; if a busy machine ended it first, this try proves nothing.
            with stack.worker.frozen():
                running = status(job["id"]) == "running"
                if running:
                    cancelled = client.post(f"/v1/jobs/{job['id']}/cancel").json()
            if running:
                break
        else:
            pytest.fail("in three tries, every job ended before it could be cancelled")
        # Its four sequences leave the engine once the abort reaches it.
        wait_until(
            lambda: delta.rescrape()("inferq_jobs_finished_total", **ABORTED) >= 1,
            timeout_s=30,
            what="aborted in the engine",
        )
        final = client.get(f"/v1/jobs/{job['id']}").json()
    assert cancelled["status"] == "cancelled"
    # Aborted in the engine, rather than left to generate its 4,000 tokens.
    assert delta("inferq_jobs_finished_total", **ABORTED) == 1
    assert delta("inferq_jobs_admitted_total") == 1
    assert delta("inferq_jobs_finished_total", outcome="succeeded", reason="length") == 0
    assert delta("inferq_generation_tokens_total") == 0
    assert value(delta.after, "inferq_sequences_in_flight") == 0
    assert final["status"] == "cancelled"
    assert final["choices"] is None


def test_health_commands_see_maintenance_and_workers(deployment) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    deployed = deployment()  # API, maintenance worker and beat; no GPU worker

    def health(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cli.main", "health", *args],
            env={**os.environ, **deployed.env},
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    deadline = time.monotonic() + 30
    while (result := health("maintenance")).returncode != 0 and time.monotonic() < deadline:
        time.sleep(1)
    assert result.returncode == 0, result.stderr
    assert health("worker", "service@test").returncode == 0
    missing = health("worker", "nobody@nowhere")
    assert missing.returncode == 1
    assert "did not answer" in missing.stderr
