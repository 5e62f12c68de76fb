"""Usage by tenant, model, key and day, and per-key quotas, through the running stack
(API, GPU worker with vLLM on CPU, Postgres, Redis): the REST API, the `openai` client
and `inferq usage`."""

from __future__ import annotations

import csv
import io
import os
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from openai import OpenAI, RateLimitError, UnprocessableEntityError
from sqlalchemy import func, select

from inferq.domain.jobs import JobStatus
from inferq.store.models import BatchRow, JobRow
from tests.conftest import ADMIN_KEY, Stack
from tests.helpers.processes import INFERQ
from tests.helpers.waiting import wait_until
from tests.integration.api.test_batches import chat_line, upload, wait_for

pytestmark = pytest.mark.engine


def _client(stack: Stack, key: str) -> OpenAI:
    return OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0, timeout=120)


def _usage(stack: Stack, key: str, **params: Any) -> dict[str, Any]:
    with stack.client(key) as http:
        response = http.get("/v1/usage", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def _results(page: dict[str, Any]) -> list[dict[str, Any]]:
    return [result for bucket in page["data"] for result in bucket["results"]]


def _submit_jobs(stack: Stack, key: str, count: int, *, max_tokens: int = 6) -> list[str]:
    with stack.client(key) as http:
        ids = []
        for i in range(count):
            response = http.post(
                "/v1/jobs",
                json={"prompt": f"usage {i}", "max_tokens": max_tokens, "ignore_eos": True},
            )
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
    return ids


def _ended(stack: Stack, ids: list[str]) -> None:
    wait_until(
        lambda: all(j.status.is_terminal for j in stack.store.get_jobs(ids)),
        timeout_s=120,
        what="the jobs to end",
    )


def _from_jobs(stack: Stack, tenant: str) -> dict[str, int]:
    """What the tenant's job rows add up to (while retention has not deleted them)."""
    succeeded = (JobRow.tenant == tenant, JobRow.status == JobStatus.SUCCEEDED.value)
    ended = (JobRow.tenant == tenant, JobRow.finished_at.is_not(None))
    with stack.sessions() as session:
        return {
            "input_tokens": session.scalar(
                select(func.sum(JobRow.prompt_tokens)).where(*succeeded)
            ),
            "output_tokens": session.scalar(
                select(func.sum(JobRow.completion_tokens)).where(*succeeded)
            ),
            "jobs": session.scalar(select(func.count()).where(*ended, JobRow.batch_id.is_(None))),
            "batch_lines": session.scalar(
                select(func.count()).where(*ended, JobRow.batch_id.is_not(None))
            ),
            "batches": session.scalar(select(func.count()).where(BatchRow.tenant == tenant)),
        }


def test_usage_adds_up_every_job_of_a_tenant_by_model_key_and_day(stack: Stack) -> None:
    first = stack.new_key()
    tenant = stack.tenant_of(first)
    second = stack.new_key(tenant=tenant)
    ids = _submit_jobs(stack, first, 3)
    chat = _client(stack, second).chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5
    )
    batch_client = _client(stack, second)
    batch = batch_client.batches.create(
        input_file_id=upload(batch_client, [chat_line(i) for i in range(4)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert wait_for(batch_client, batch.id).status == "completed"
    _ended(stack, ids)

    expected = _from_jobs(stack, tenant)
    (total,) = _results(_usage(stack, first))
    assert {name: total[name] for name in expected} == expected
    assert total["num_model_requests"] == expected["jobs"] + expected["batch_lines"] == 8
    assert total["batches"] == 1
    by_key = {r["api_key_id"]: r for r in _results(_usage(stack, first, group_by="api_key_id"))}
    first_id, second_id = (stack.keys.find(k).id for k in (first, second))  # type: ignore[union-attr]
    assert by_key[first_id]["jobs"] == 3
    assert by_key[second_id]["jobs"] == 1
    assert by_key[second_id]["batch_lines"] == 4
    assert by_key[second_id]["output_tokens"] >= chat.usage.completion_tokens  # type: ignore[union-attr]
    (per_model,) = _results(_usage(stack, first, group_by="model,api_key_id", bucket_width="1h"))[
        :1
    ]
    assert per_model["model"] == "tiny"
    # Days are UTC days; the current one is the last bucket.
    page = _usage(stack, first)
    assert page["object"] == "page"
    assert len(page["data"]) == 7
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    assert page["data"][-1]["start_time"] == int(today.timestamp())
    assert page["data"][-1]["end_time"] == int((today + timedelta(days=1)).timestamp())


def test_a_tenant_reads_only_its_own_usage_and_an_admin_reads_every_tenants(
    stack: Stack,
) -> None:
    mine, theirs = stack.new_key(), stack.new_key()
    _ended(stack, _submit_jobs(stack, mine, 1) + _submit_jobs(stack, theirs, 2))
    tenant = stack.tenant_of(mine)
    other = stack.tenant_of(theirs)

    (own,) = _results(_usage(stack, mine))
    assert own["jobs"] == 1
    with stack.client(mine) as http:
        refused = http.get("/v1/usage", params={"tenant": other})
        grouped = http.get("/v1/usage", params={"group_by": "tenant"})
    assert refused.status_code == 403
    assert "own tenant" in refused.json()["error"]["message"]
    assert grouped.status_code == 422

    everyone = _results(_usage(stack, ADMIN_KEY, group_by="tenant"))
    by_tenant = {r["tenant"]: r for r in everyone}
    assert by_tenant[tenant]["jobs"] == 1
    assert by_tenant[other]["jobs"] == 2
    (one,) = _results(_usage(stack, ADMIN_KEY, tenant=other))
    assert one["jobs"] == 2


def test_prometheus_counts_usage_by_tenant_and_model(stack: Stack) -> None:
    key = stack.new_key()
    _ended(stack, _submit_jobs(stack, key, 2, max_tokens=4))
    tenant = stack.tenant_of(key)
    metrics = httpx.get(stack.url + "/metrics").text
    assert f'inferq_tenant_output_tokens_total{{model="tiny",tenant="{tenant}"}} 8.0' in metrics
    assert f'inferq_tenant_requests_total{{model="tiny",tenant="{tenant}"}} 2.0' in metrics


def _quota_key(stack: Stack, **quota: int) -> tuple[str, str]:
    secret = stack.new_key()
    key = stack.keys.find(secret)
    assert key is not None
    with stack.client(ADMIN_KEY) as http:
        response = http.patch(f"/v1/admin/keys/{key.id}", json=quota)
    assert response.status_code == 200, response.text
    for name, value in quota.items():
        assert response.json()[name] == value
    return secret, key.id


def _held(stack: Stack, key_id: str) -> int:
    with stack.sessions() as session:
        return int(
            session.scalar(
                select(func.count()).where(
                    JobRow.key_id == key_id, JobRow.status.in_(["queued", "running"])
                )
            )
            or 0
        )


def test_queued_tokens_quota_refuses_with_429_then_accepts_once_work_ends(stack: Stack) -> None:
    secret, key_id = _quota_key(stack, max_queued_tokens=600)
    client = _client(stack, secret)
    lines = [chat_line(i, max_tokens=60) for i in range(5)]
    file_id = upload(client, lines)
    # Frozen, so that the first job is still queued while the others come.
    with stack.worker.frozen(), stack.client(secret) as http:
        first = http.post("/v1/jobs", json={"prompt": "long", "max_tokens": 500})
        assert first.status_code == 202, first.text
        refused = http.post("/v1/jobs", json={"prompt": "more", "max_tokens": 200})
        status = http.get("/v1/status").json()["quota"]
        # The `openai` client's error is OpenAI's: a RateLimitError with its code.
        with pytest.raises(RateLimitError) as raised:
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=200
            )
        # A batch over the quota is refused whole: not a line of it is queued.
        with pytest.raises(RateLimitError):
            client.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        held = _held(stack, key_id)
        # More than the quota can ever hold is a request to change, not to retry.
        with pytest.raises(UnprocessableEntityError):
            client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=700
            )
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) >= 1
    error = refused.json()["error"]
    assert error["code"] == error["type"] == "insufficient_quota"
    assert "max_queued_tokens" in error["message"]
    assert "600" in error["message"]
    assert status["max_queued_tokens"] == 600
    assert status["queued_tokens"] > 500
    assert raised.value.code == "insufficient_quota"
    assert held == 1
    with stack.sessions() as session:
        assert session.scalar(select(func.count()).where(BatchRow.key_id == key_id)) == 0

    _ended(stack, [first.json()["id"]])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert wait_for(client, batch.id).status == "completed"


def test_a_cancelled_job_frees_its_queued_tokens(stack: Stack) -> None:
    secret, _ = _quota_key(stack, max_queued_tokens=600)
    with stack.worker.frozen(), stack.client(secret) as http:
        first = http.post("/v1/jobs", json={"prompt": "long", "max_tokens": 500})
        assert http.post("/v1/jobs", json={"prompt": "x", "max_tokens": 300}).status_code == 429
        assert http.post(f"/v1/jobs/{first.json()['id']}/cancel").status_code == 200
        again = http.post("/v1/jobs", json={"prompt": "x", "max_tokens": 300})
    assert again.status_code == 202, again.text
    _ended(stack, [again.json()["id"]])


def test_daily_quota_refuses_until_the_next_utc_day(stack: Stack) -> None:
    secret, _ = _quota_key(stack, daily_tokens=200)
    _ended(stack, _submit_jobs(stack, secret, 1, max_tokens=60))
    with stack.client(secret) as http:
        refused = http.post("/v1/jobs", json={"prompt": "x", "max_tokens": 150})
        status = http.get("/v1/status").json()["quota"]
    assert refused.status_code == 429
    message = refused.json()["error"]["message"]
    assert "daily_tokens" in message
    assert "00:00 UTC" in message
    midnight = datetime.now(UTC).replace(hour=0, minute=0, second=0) + timedelta(days=1)
    left = (midnight - datetime.now(UTC)).total_seconds()
    assert abs(int(refused.headers["retry-after"]) - left) < 60
    assert status["daily_tokens"] == 200
    assert status["used_today"] >= 60
    assert status["tokens_today"] == status["used_today"]


def test_only_an_admin_sets_quotas(stack: Stack) -> None:
    secret = stack.new_key()
    key = stack.keys.find(secret)
    assert key is not None
    with stack.client(secret) as http:
        assert http.patch(f"/v1/admin/keys/{key.id}", json={"daily_tokens": 1}).status_code == 403
        assert http.get("/v1/admin/keys").status_code == 403
    with stack.client(ADMIN_KEY) as http:
        listed = http.get("/v1/admin/keys").json()["data"]
        missing = http.patch("/v1/admin/keys/key_nope", json={"daily_tokens": 1})
        weightless = http.patch(f"/v1/admin/keys/{key.id}", json={"weight": 0})
    assert key.id in {k["id"] for k in listed}
    assert missing.status_code == 404
    assert weightless.status_code == 422
    assert "weight" in weightless.text


def _inferq(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.env, "INFERQ_API_URL": stack.url}
    return subprocess.run(
        [*INFERQ, *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_inferq_usage_prints_a_table_and_csv_and_inferq_keys_sets_quotas(stack: Stack) -> None:
    secret = stack.new_key()
    key = stack.keys.find(secret)
    assert key is not None
    _ended(stack, _submit_jobs(stack, secret, 2, max_tokens=3))

    table = _inferq(stack, "usage", "--api-key", secret, "--group-by", "model")
    assert table.returncode == 0, table.stderr
    assert "embedding" in table.stdout
    assert "tiny" in table.stdout
    raw = _inferq(stack, "usage", "--api-key", secret, "--csv", "--group-by", "model,api_key_id")
    assert raw.returncode == 0, raw.stderr
    rows = [r for r in csv.DictReader(io.StringIO(raw.stdout)) if r["jobs"] != "0"]
    assert [(r["model"], r["api_key_id"], r["output_tokens"], r["jobs"]) for r in rows] == [
        ("tiny", key.id, "6", "2")
    ]

    updated = _inferq(stack, "keys", "update", key.id, "--max-queued-tokens", "50")
    assert updated.returncode == 0, updated.stderr
    assert "max_queued_tokens=50" in updated.stdout
    weighted = _inferq(stack, "keys", "update", key.id, "--weight", "4")
    assert weighted.returncode == 0, weighted.stderr
    assert "weight=4" in weighted.stdout
    assert _inferq(stack, "keys", "update", key.id, "--weight", "0").returncode == 2
    with stack.client(secret) as http:
        over = http.post("/v1/jobs", json={"prompt": "x", "max_tokens": 60})
    assert over.status_code == 422  # more than the key can ever queue
    assert "max_queued_tokens" in over.json()["error"]["message"]
