"""API keys, tenant isolation, limits and rate limits, through the real API, Redis and
Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from inferq.store.models import JobRow
from tests.conftest import MODEL_NAME, Stack
from tests.helpers.waiting import poll

pytestmark = pytest.mark.engine


def tenant_jobs(stack: Stack, tenant: str) -> int:
    with stack.sessions() as session:
        query = select(func.count()).select_from(JobRow).where(JobRow.tenant == tenant)
        return int(session.scalar(query) or 0)


def inferq(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_v1_routes_need_a_key_and_say_how_to_get_one(stack: Stack) -> None:
    with stack.client(key=None) as client:
        for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/x")):
            response = client.request(method, path, json={"prompt": "hi"})
            assert response.status_code == 401, path
            assert response.headers["www-authenticate"] == "Bearer"
            assert "inferq keys create" in response.json()["error"]["message"]
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code == 200
        assert client.get("/docs").status_code == 200
    with stack.client(key="iq_not-a-real-key") as client:
        response = client.get("/v1/jobs")
    assert response.status_code == 401
    assert "unknown or revoked" in response.json()["error"]["message"]


def test_tenants_never_see_each_others_jobs(stack: Stack) -> None:
    alice, bob = stack.new_key(), stack.new_key()
    colleague = stack.new_key(tenant=stack.tenant_of(alice))
    with stack.client(alice) as client:
        job = client.post("/v1/jobs", json={"prompt": "private", "max_tokens": 2}).json()
    with stack.client(bob) as client:
        assert client.get(f"/v1/jobs/{job['id']}").status_code == 404
        assert client.get(f"/v1/jobs/{job['id']}", params={"wait": 1}).status_code == 404
        assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 404
        assert job["id"] not in [j["id"] for j in client.get("/v1/jobs").json()["data"]]
    with stack.client(colleague) as client:
        # Another key of the same tenant shares its jobs.
        assert client.get(f"/v1/jobs/{job['id']}").status_code == 200
    with stack.client() as admin:
        assert admin.get(f"/v1/jobs/{job['id']}").status_code == 200
        listed = admin.get("/v1/jobs", params={"limit": 100}).json()["data"]
        assert job["id"] in [j["id"] for j in listed]


def test_keys_made_with_the_cli_work_until_revoked(stack: Stack) -> None:
    created = inferq(stack, "keys", "create", "--name", "ci-bot", "--tenant", "robots")
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    key_id = created.stderr.split()[1]
    assert secret.startswith("iq_")
    listing = inferq(stack, "keys", "list").stdout
    assert key_id in listing
    assert secret not in listing
    assert "tenant:robots" in listing
    with stack.client(secret) as client:
        assert client.get("/v1/jobs").status_code == 200
        revoked = inferq(stack, "keys", "revoke", key_id)
        assert revoked.returncode == 0, revoked.stderr
        response = client.get("/v1/jobs")
    assert response.status_code == 401
    assert f"revoked {key_id}" in revoked.stdout
    assert "revoked" in inferq(stack, "keys", "list").stdout
    assert inferq(stack, "keys", "revoke", "key_nope").returncode == 1


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata", "at most 16 items"),
        ({"metadata": {"k" * 65: "v"}}, "metadata", "at most 64 characters"),
        ({"metadata": {"k": "v" * 513}}, "metadata.k", "at most 512 characters"),
        ({"metadata": {"k": 1}}, "metadata.k", "valid string"),
        ({"max_tokens": 9000}, "max_tokens", "over the limit of 8192"),
    ],
)
def test_limits_are_refused_with_a_message_that_says_what_to_fix(
    stack: Stack, body: dict[str, Any], param: str, message: str
) -> None:
    key = stack.new_key()
    tenant = stack.tenant_of(key)
    with stack.client(key) as client:
        response = client.post("/v1/jobs", json={"prompt": "hi", "max_tokens": 2, **body})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"].startswith(param)
    assert message in error["message"]
    assert tenant_jobs(stack, tenant) == 0


def test_an_oversized_body_is_refused_with_413(stack: Stack) -> None:
    big = b'{"prompt": "' + b"a" * 2_000_000 + b'"}'

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536]

    with stack.client() as client:
        declared = client.post(
            "/v1/jobs", content=big, headers={"content-type": "application/json"}
        )
        streamed = client.post(
            "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
        )
    for response in (declared, streamed):
        assert response.status_code == 413
        assert "over the limit of 1048576 bytes" in response.json()["error"]["message"]


def test_the_request_rate_limit_admits_exactly_the_quota(stack: Stack) -> None:
    limited, other = stack.new_key(rpm=5), stack.new_key(rpm=5)
    with stack.client(limited) as client:
        codes = [client.get("/v1/jobs").status_code for _ in range(5)]
        refused = client.get("/v1/jobs")
    assert codes == [200] * 5
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "5 requests per minute" in refused.json()["error"]["message"]
    with stack.client(other) as client:
        assert client.get("/v1/jobs").status_code == 200


def test_the_token_rate_limit_counts_prompt_and_max_tokens(stack: Stack) -> None:
    limited, other = stack.new_key(tpm=100), stack.new_key(tpm=100)
    tenant = stack.tenant_of(limited)
    body = {"prompt": "Hello", "max_tokens": 60}
    with stack.client(limited) as client:
        first = client.post("/v1/jobs", json=body)
        second = client.post("/v1/jobs", json=body)
        huge = client.post("/v1/jobs", json={"prompt": "Hello", "max_tokens": 200})
    assert first.status_code == 202
    assert second.status_code == 429
    assert int(second.headers["retry-after"]) >= 1
    assert "100 tokens per minute" in second.json()["error"]["message"]
    assert huge.status_code == 422
    assert "lower max_tokens" in huge.json()["error"]["message"]
    assert tenant_jobs(stack, tenant) == 1
    with stack.client(other) as client:
        assert client.post("/v1/jobs", json=body).status_code == 202


def test_a_pickled_message_pushed_into_redis_runs_nothing(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from inferq.broker.celery_app import make_celery
    from inferq.constants import RUN_JOBS_TASK
    from inferq.domain.queue_names import interactive_queue
    from inferq.settings import Settings

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self) -> tuple[Any, ...]:
            return (os.system, (f"touch {marker}",))

    settings = Settings(
        redis_url=stack.env["INFERQ_REDIS_URL"],
        redis_key_prefix=stack.env["INFERQ_REDIS_KEY_PREFIX"],
    )
    queue = interactive_queue(MODEL_NAME)
    attacker = make_celery(settings, serving=MODEL_NAME)
    attacker.send_task(RUN_JOBS_TASK, args=[Exploit()], queue=queue, serializer="pickle")
    with stack.client() as client:
        # A job submitted after the pickle finishing means the worker went past it.
        job = client.post("/v1/jobs", json={"prompt": "after", "max_tokens": 2}).json()
        done = client.get(f"/v1/jobs/{job['id']}", params={"wait": 60}).json()
    assert done["status"] == "succeeded"
    assert not marker.exists()
    assert "untrusted content" in stack.worker.log_tail(400)
    import redis

    # Taken from its queue, refused and dropped: a taken message lives in the worker only.
    client = redis.Redis.from_url(settings.redis_url)
    assert client.llen(settings.redis_key_prefix + queue) == 0


def test_without_keys_the_api_refuses_everything_and_says_what_to_do(
    stack: Stack,
    tmp_path,
    pg_template: str,  # type: ignore[no-untyped-def]
) -> None:
    from tests.conftest import new_key_prefix
    from tests.helpers.databases import cloned_database
    from tests.helpers.processes import free_port, start_api

    with cloned_database(pg_template) as database_url:
        env = {
            **{k: v for k, v in stack.env.items() if k != "INFERQ_BOOTSTRAP_ADMIN_KEY"},
            "INFERQ_DATABASE_URL": database_url,
            "INFERQ_REDIS_KEY_PREFIX": new_key_prefix(),
        }
        port = free_port()
        api = start_api(env=env, port=port, log_dir=tmp_path)
        try:
            response = httpx.get(f"http://127.0.0.1:{port}/v1/jobs")
            assert response.status_code == 401
            assert "inferq keys create --name admin --admin" in api.log_tail()
        finally:
            api.stop()


def test_a_full_interactive_queue_answers_429_with_retry_after(
    stack: Stack,
    tmp_path,
    pg_template: str,  # type: ignore[no-untyped-def]
    tiny_model: Path,
) -> None:
    from tests.conftest import ADMIN_KEY, new_key_prefix
    from tests.helpers.databases import cloned_database
    from tests.helpers.models import register_model
    from tests.helpers.processes import free_port, start_api

    with cloned_database(pg_template) as database_url:
        register_model(database_url, tiny_model)
        env = {
            **stack.env,
            "INFERQ_DATABASE_URL": database_url,
            # No worker reads this key space, so submitted jobs stay in the queue.
            "INFERQ_REDIS_KEY_PREFIX": new_key_prefix(),
            "INFERQ_INTERACTIVE_HIGH_WATER": "3",
        }
        port = free_port()
        api = start_api(env=env, port=port, log_dir=tmp_path)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers) as client:
                codes = [
                    client.post("/v1/jobs", json={"prompt": "x", "max_tokens": 1}).status_code
                    for _ in range(3)
                ]
                full = client.post("/v1/jobs", json={"prompt": "x", "max_tokens": 1})
                # Bulk work is still accepted: a batch file goes to its own queue.
                line = {
                    "custom_id": "a",
                    "method": "POST",
                    "url": "/v1/completions",
                    "body": {"model": "tiny", "prompt": "x", "max_tokens": 1},
                }
                uploaded = client.post(
                    "/v1/files",
                    files={"file": ("in.jsonl", json.dumps(line).encode())},
                    data={"purpose": "batch"},
                ).json()
                batch = client.post(
                    "/v1/batches",
                    json={"input_file_id": uploaded["id"], "endpoint": "/v1/completions"},
                ).json()
        finally:
            api.stop()
    assert codes == [202] * 3
    assert full.status_code == 429
    assert full.headers["retry-after"] == "10"
    error = full.json()["error"]
    assert error["code"] == "queue_full"
    assert "holds 3 jobs" in error["message"]
    assert batch["status"] == "in_progress"
    assert batch["request_counts"]["total"] == 1


def test_flower_needs_credentials_and_with_them_lists_the_worker(stack: Stack, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers.processes import ServiceProcess, free_port

    refused = inferq(stack, "flower")
    assert refused.returncode == 2
    assert "INFERQ_FLOWER_BASIC_AUTH" in refused.stderr

    port = free_port()
    env = {
        **stack.env,
        "INFERQ_FLOWER_PORT": str(port),
        "INFERQ_FLOWER_BASIC_AUTH": "ops:flower-7c1e93ab52d4",
    }
    flower = ServiceProcess(
        "flower", [sys.executable, "-m", "cli.main", "flower"], env=env, log_dir=tmp_path
    )
    base = f"http://127.0.0.1:{port}"

    def serving() -> bool:
        try:
            return httpx.get(base + "/", timeout=2).status_code == 401
        except httpx.HTTPError:
            return False

    try:
        flower.wait_until(serving, timeout_s=60, what="serving")
        for path in ("/", "/workers", "/tasks", "/api/workers", "/api/tasks"):
            assert httpx.get(base + path, timeout=5).status_code == 401, path
        wrong = httpx.get(base + "/api/workers", auth=("ops", "wrong"), timeout=5)
        assert wrong.status_code == 401
        workers = httpx.get(
            base + "/api/workers",
            params={"refresh": "1"},
            auth=("ops", "flower-7c1e93ab52d4"),
            timeout=30,
        )
        assert workers.status_code == 200
        assert "worker@test" in workers.json()
        # Which model a worker serves: the queues it consumes are that model's.
        queues = {q["name"] for q in workers.json()["worker@test"]["active_queues"]}
        assert queues == {f"interactive:{MODEL_NAME}", f"bulk:{MODEL_NAME}"}
        # A finished job's task, with its job id, worker, state and runtime. Workers send
        # task events once Flower has asked for them (it asks every few seconds), so the
        # first jobs may go unseen: submit until one shows.

        def finished_task(job_id: str) -> dict[str, Any] | None:
            tasks = httpx.get(
                base + "/api/tasks", auth=("ops", "flower-7c1e93ab52d4"), timeout=10
            ).json()
            return next(
                (
                    t
                    for t in tasks.values()
                    if job_id in (t["args"] or "") and t["state"] == "SUCCESS"
                ),
                None,
            )

        task = None
        deadline = time.monotonic() + 40
        with stack.client() as client:
            while task is None and time.monotonic() < deadline:
                job = client.post("/v1/jobs", json={"prompt": "seen", "max_tokens": 2}).json()
                client.get(f"/v1/jobs/{job['id']}", params={"wait": 60})
                # Flower reads the task's events from Redis: a few looks before another job.
                task = poll(partial(finished_task, job["id"]), timeout_s=3, interval_s=0.2)
        assert task is not None
        assert task["name"] == "inferq.run_jobs"
        assert task["state"] == "SUCCESS"
        assert task["worker"] == "worker@test"
        assert task["runtime"] > 0
    finally:
        flower.stop()
