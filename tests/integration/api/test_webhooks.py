"""Webhooks end to end: the running stack (API, GPU worker on vLLM, delivery worker, beat)
sends to a real HTTP receiver, which checks every request with `standardwebhooks`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from inferq.domain.webhooks import sign
from tests.conftest import MODEL_NAME, Stack
from tests.helpers.broker import Broker
from tests.helpers.receiver import Received, Receiver, Reply, receiver
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def hooks() -> Iterator[Receiver]:
    with receiver() as server:
        yield server


@pytest.fixture
def api(stack: Stack) -> Iterator[httpx.Client]:
    with stack.client() as client:
        yield client


def _job(api: httpx.Client, url: str, **extra: Any) -> str:
    body = {"prompt": "Once upon a time", "max_tokens": 8, "webhook_url": url, **extra}
    response = api.post("/v1/jobs", json=body)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def _secret(api: httpx.Client, url: str) -> str:
    [endpoint] = [e for e in api.get("/v1/webhook-endpoints").json()["data"] if e["url"] == url]
    return str(endpoint["secret"])


def _deliveries(api: httpx.Client, **filters: str) -> list[dict[str, Any]]:
    response = api.get("/v1/webhook-deliveries", params=filters)
    assert response.status_code == 200, response.text
    return list(response.json()["data"])


def _wait_delivery(
    api: httpx.Client, state: str, timeout_s: float = 60, **filters: str
) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        deliveries = _deliveries(api, **filters)
        return deliveries[0] if deliveries and deliveries[0]["state"] == state else None

    return wait_until(
        found, timeout_s=timeout_s, what=f"a {state} delivery for {filters}", interval_s=0.2
    )


def _wait_maintenance(broker: Broker) -> None:
    """Wait out a few maintenance passes: each would have woken the delivery worker for a
    delivery still due (retries come due there), so one sent again would be sent by now."""
    broker.wait_maintenance_passes(3, timeout_s=30)


def _verified(secret: str, received: Received) -> dict[str, Any]:
    payload: dict[str, Any] = Webhook(secret).verify(received.body, received.headers)
    return payload


def test_a_finished_job_is_pushed_signed_with_its_result(
    api: httpx.Client, hooks: Receiver, broker: Broker
) -> None:
    url = hooks.url("/ok")
    job_id = _job(api, url, metadata={"run": "hooks"})
    [request] = hooks.wait_for("/ok", 1)
    payload = _verified(_secret(api, url), request)
    assert payload["type"] == "job.succeeded"
    job = payload["data"]
    assert job["id"] == job_id
    assert job["status"] == "succeeded"
    assert job["metadata"] == {"run": "hooks"}
    # The result as stored (the tiny random model's few tokens may decode to no text).
    assert job["choices"] == api.get(f"/v1/jobs/{job_id}").json()["choices"]
    assert len(job["choices"]) == 1
    assert job["usage"]["completion_tokens"] > 0
    delivery = _wait_delivery(api, "succeeded", job_id=job_id)
    assert request.headers["webhook-id"] == delivery["id"]
    assert delivery["event"] == "job.succeeded"
    [attempt] = delivery["attempts"]
    assert attempt["status_code"] == 200
    assert attempt["latency_ms"] >= 0
    assert attempt["error"] is None
    _wait_maintenance(broker)  # a few maintenance passes later, still exactly one request
    assert len(hooks.received("/ok")) == 1


def test_failed_attempts_are_retried_with_the_same_id_until_one_succeeds(
    api: httpx.Client, hooks: Receiver, broker: Broker
) -> None:
    failures = 3
    hooks.script("/flaky", *[Reply(500)] * failures, Reply(200))
    url = hooks.url("/flaky")
    job_id = _job(api, url)
    requests = hooks.wait_for("/flaky", failures + 1)
    secret = _secret(api, url)
    assert len({r.headers["webhook-id"] for r in requests}) == 1
    assert all(_verified(secret, r)["data"]["id"] == job_id for r in requests)
    delivery = _wait_delivery(api, "succeeded", job_id=job_id)
    codes = [a["status_code"] for a in delivery["attempts"]]
    assert codes == [500] * failures + [200]
    assert all("HTTP 500" in a["error"] for a in delivery["attempts"][:failures])
    _wait_maintenance(broker)
    assert len(hooks.received("/flaky")) == failures + 1


def test_gone_disables_the_endpoint_until_it_is_enabled_and_replayed(
    api: httpx.Client, hooks: Receiver
) -> None:
    hooks.script("/gone", Reply(410), Reply(200))
    url = hooks.url("/gone")
    first = _job(api, url)
    hooks.wait_for("/gone", 1)
    delivery = _wait_delivery(api, "disabled", job_id=first)
    [endpoint] = [e for e in api.get("/v1/webhook-endpoints").json()["data"] if e["url"] == url]
    assert endpoint["enabled"] is False
    assert "410" in endpoint["disabled_reason"]

    second = _job(api, url)
    _wait_delivery(api, "disabled", job_id=second)
    assert len(hooks.received("/gone")) == 1  # nothing is sent to a disabled endpoint
    refused = api.post(f"/v1/webhook-deliveries/{delivery['id']}/replay")
    assert refused.status_code == 409
    assert "enable it first" in refused.json()["error"]["message"]

    assert api.post(f"/v1/webhook-endpoints/{endpoint['id']}/enable").status_code == 200
    replayed = api.post(f"/v1/webhook-deliveries/{delivery['id']}/replay")
    assert replayed.status_code == 202, replayed.text
    [_, again] = hooks.wait_for("/gone", 2)
    assert again.headers["webhook-id"] == delivery["id"]
    assert _verified(_secret(api, url), again)["data"]["id"] == first
    _wait_delivery(api, "succeeded", job_id=first)


def test_a_receiver_that_hangs_times_out_and_is_tried_again(
    api: httpx.Client, hooks: Receiver
) -> None:
    hooks.script("/slow", Reply(200, delay_s=5), Reply(200))
    job_id = _job(api, hooks.url("/slow"))
    delivery = _wait_delivery(api, "succeeded", job_id=job_id, timeout_s=90)
    first, second = delivery["attempts"]
    assert first["status_code"] is None
    assert first["error"] == "no answer within 2 s"
    assert 1900 <= first["latency_ms"] < 5000
    assert second["status_code"] == 200


def test_retry_after_is_honoured(api: httpx.Client, hooks: Receiver) -> None:
    hooks.script("/busy", Reply(503, headers={"Retry-After": "6"}), Reply(200))
    job_id = _job(api, hooks.url("/busy"))
    first, second = hooks.wait_for("/busy", 2, timeout_s=60)
    assert second.at - first.at >= 5.5  # the schedule alone would retry after about 1 s
    _wait_delivery(api, "succeeded", job_id=job_id)


def test_only_the_events_asked_for_are_sent(api: httpx.Client, hooks: Receiver) -> None:
    url = hooks.url("/failures-only")
    job_id = _job(api, url, webhook_events=["job.failed"])
    done = api.get(f"/v1/jobs/{job_id}", params={"wait": 60}).json()
    assert done["status"] == "succeeded"
    # A delivery is queued in the transaction that writes the result: none was.
    assert _deliveries(api, job_id=job_id) == []
    # A later job to the same endpoint, asking for every event, is delivered: the delivery
    # worker has been through what was due, and sent nothing for the first.
    later = _job(api, url)
    _wait_delivery(api, "succeeded", job_id=later)
    [request] = hooks.received("/failures-only")
    assert json.loads(request.body)["data"]["id"] == later


def test_a_finished_batch_is_pushed_with_the_batch_object(
    api: httpx.Client, hooks: Receiver
) -> None:
    lines = [
        {
            "custom_id": f"r{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": MODEL_NAME, "prompt": f"Hello {i}", "max_tokens": 4},
        }
        for i in range(5)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = api.post(
        "/v1/files", files={"file": ("in.jsonl", content)}, data={"purpose": "batch"}
    ).json()
    url = hooks.url("/batches")
    created = api.post(
        "/v1/batches",
        json={
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/completions",
            "completion_window": "1h",
            "webhook_url": url,
        },
    )
    assert created.status_code == 200, created.text
    [request] = hooks.wait_for("/batches", 1, timeout_s=120)
    payload = _verified(_secret(api, url), request)
    assert payload["type"] == "batch.completed"
    batch = payload["data"]
    assert batch["id"] == created.json()["id"]
    assert batch["status"] == "completed"
    assert batch["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert batch["output_file_id"]
    assert _wait_delivery(api, "succeeded", batch_id=batch["id"])["event"] == "batch.completed"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://127.0.0.2:{port}/x", "127.0.0.2, a loopback address"),
        ("http://2130706434:{port}/x", "127.0.0.2, a loopback address"),
        ("http://0177.0.0.2:{port}/x", "127.0.0.2, a loopback address"),
        ("http://[::ffff:127.0.0.2]:{port}/x", "IPv4-embedding IPv6 (loopback)"),
        ("http://[::1]:{port}/x", "::1, a loopback address"),
        ("http://169.254.169.254/latest/meta-data", "a link-local address"),
        ("http://10.0.0.1/x", "a private address"),
        ("http://[fd00::1]/x", "a private address"),
        ("http://224.0.0.1/x", "a multicast address"),
        ("ftp://127.0.0.1:{port}/x", "only http and https"),
    ],
)
def test_unsafe_webhook_urls_are_refused_and_never_called(
    api: httpx.Client, url: str, why: str
) -> None:
    with receiver("127.0.0.2") as elsewhere:
        target = url.format(port=elsewhere.base_url.rsplit(":", 1)[1])
        response = api.post(
            "/v1/jobs", json={"prompt": "hi", "max_tokens": 2, "webhook_url": target}
        )
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["param"] == "webhook_url"
        assert why in error["message"]
        registered = api.post("/v1/webhook-endpoints", json={"url": target})
        assert registered.status_code == 422
        # Nothing was kept that could ever be sent (a delivery needs an endpoint), and the
        # API did not try the address while checking it.
        endpoints = api.get("/v1/webhook-endpoints").json()["data"]
        assert target not in {e["url"] for e in endpoints}
        assert elsewhere.received() == []


def test_a_tampered_body_or_a_stale_timestamp_fails_verification(
    api: httpx.Client, hooks: Receiver
) -> None:
    url = hooks.url("/verify")
    _job(api, url)
    [request] = hooks.wait_for("/verify", 1)
    secret = _secret(api, url)
    _verified(secret, request)
    tampered = request.body.replace(b'"succeeded"', b'"failed"')
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(secret).verify(tampered, request.headers)
    old = datetime.now(UTC) - timedelta(minutes=10)
    stale = {
        **request.headers,
        "webhook-timestamp": str(int(old.timestamp())),
        "webhook-signature": sign(
            [secret],
            msg_id=request.headers["webhook-id"],
            timestamp=old,
            body=request.body.decode(),
        ),
    }
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(secret).verify(request.body, stale)


def test_a_rotated_secret_signs_beside_the_old_one(api: httpx.Client, hooks: Receiver) -> None:
    url = hooks.url("/rotate")
    endpoint = api.post("/v1/webhook-endpoints", json={"url": url}).json()
    rotated = api.post(f"/v1/webhook-endpoints/{endpoint['id']}/rotate-secret").json()
    assert rotated["secret"] != endpoint["secret"]
    assert rotated["previous_secret_expires_at"] is not None
    _job(api, url)
    [request] = hooks.wait_for("/rotate", 1)
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    for secret in (endpoint["secret"], rotated["secret"]):
        assert _verified(secret, request)["type"] == "job.succeeded"


def test_another_tenant_sees_neither_endpoints_nor_deliveries(
    stack: Stack, api: httpx.Client, hooks: Receiver
) -> None:
    job_id = _job(api, hooks.url("/mine"))
    _wait_delivery(api, "succeeded", job_id=job_id)
    with stack.client(stack.new_key(tenant="other-tenant")) as other:
        assert other.get("/v1/webhook-endpoints").json()["data"] == []
        assert other.get("/v1/webhook-deliveries", params={"job_id": job_id}).json()["data"] == []
        delivery_id = _deliveries(api, job_id=job_id)[0]["id"]
        assert other.post(f"/v1/webhook-deliveries/{delivery_id}/replay").status_code == 404
