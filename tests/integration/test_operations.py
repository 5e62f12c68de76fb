"""What operators see: Prometheus metrics after real jobs, /v1/status, and a cancel that
reaches the engine."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ADMIN_KEY, Stack, new_key_prefix
from tests.helpers.databases import cloned_database
from tests.helpers.processes import free_port, start_api

pytestmark = pytest.mark.engine


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(url, timeout=10).text
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


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
    before = scrape(stack.worker.metrics_url)
    jobs = run_jobs(stack, 6, 11)
    time.sleep(0.5)
    after = scrape(stack.worker.metrics_url)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

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
    assert ("inferq_queue_depth", (("queue", "interactive"),)) in after
    assert value(after, "inferq_workers_online") == 1


def test_status_shows_the_running_worker_and_its_throughput(stack: Stack) -> None:
    run_jobs(stack, 4, 8)
    time.sleep(6)  # a heartbeat
    with stack.client() as client:
        status = client.get("/v1/status").json()
    [worker] = status["workers"]
    assert worker["name"] == "worker@test"
    assert worker["model"] == "tiny"
    assert worker["gpus"] == []
    assert worker["jobs_per_s"] > 0
    assert status["tokens_per_s"] > 0
    assert set(status["queues"]) == {"interactive", "bulk"}


def test_status_shows_queue_depth_and_logs_can_be_json(
    stack: Stack, tmp_path: Path, pg_template: str
) -> None:
    with cloned_database(pg_template) as database_url:
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
    assert status["queues"] == {"interactive": 3, "bulk": 0}
    assert status["workers"] == []
    assert status["jobs_per_s"] == 0
    records = [json.loads(line) for line in api.log_path.read_text().splitlines() if line.strip()]
    assert {r["job_id"] for r in records if "job_id" in r} == set(ids)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    assert any(r["logger"] == "uvicorn.access" for r in records)


def test_a_cancel_aborts_a_running_job_in_the_engine(stack: Stack) -> None:
    before = scrape(stack.worker.metrics_url)
    with stack.client() as client:
        job = client.post(
            "/v1/jobs", json={"prompt": "long", "max_tokens": 1000, "ignore_eos": True, "n": 4}
        ).json()
        deadline = time.monotonic() + 30
        while client.get(f"/v1/jobs/{job['id']}").json()["status"] != "running":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        cancelled = client.post(f"/v1/jobs/{job['id']}/cancel").json()
        aborted = 0.0
        while time.monotonic() < deadline:
            samples = scrape(stack.worker.metrics_url)
            aborted = value(
                samples, "inferq_jobs_finished_total", outcome="aborted", reason="cancelled"
            )
            if aborted > value(
                before, "inferq_jobs_finished_total", outcome="aborted", reason="cancelled"
            ):
                break
            time.sleep(0.1)
        final = client.get(f"/v1/jobs/{job['id']}").json()
    assert cancelled["status"] == "cancelled"
    # Aborted in the engine, rather than left to generate its 4,000 tokens.
    assert (
        aborted
        == value(before, "inferq_jobs_finished_total", outcome="aborted", reason="cancelled") + 1
    )
    assert value(samples, "inferq_generation_tokens_total") == value(
        before, "inferq_generation_tokens_total"
    )
    assert final["status"] == "cancelled"
    assert final["choices"] is None


def test_health_commands_see_maintenance_and_workers(deployment) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys

    deployed = deployment()  # API, maintenance worker and beat; no GPU worker

    def health(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "inferq.cli", "health", *args],
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
