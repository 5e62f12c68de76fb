"""Webhooks survive dead workers: the delivery row is committed with the result, so
neither a GPU worker killed after the commit, nor lost wake-up messages, nor a delivery
worker killed mid-attempt loses a webhook."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from standardwebhooks import Webhook

from inferq.constants import WEBHOOKS_QUEUE
from inferq.domain.jobs import JobStatus
from tests.fault.conftest import DeploymentFactory
from tests.helpers.broker import Broker
from tests.helpers.deployment import Deployment
from tests.helpers.processes import INFERQ, ServiceProcess, log_contains
from tests.helpers.receiver import Reply, receiver
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine


def _service(deployed: Deployment, name: str) -> ServiceProcess:
    return next(p for p in deployed.processes if p.name == name)


def _start_service(deployed: Deployment, name: str) -> ServiceProcess:
    service = ServiceProcess(
        name,
        [*INFERQ, "webhooks", "--name", f"{name}@test"],
        env=deployed.env,
        log_dir=deployed.log_dir,
    )
    deployed.processes.append(service)
    service.wait_until(log_contains(service, " ready."), timeout_s=60, what="consuming")
    return service


def _secret(deployed: Deployment, url: str) -> str:
    with deployed.client() as client:
        endpoints = client.get("/v1/webhook-endpoints").json()["data"]
    return str(next(e["secret"] for e in endpoints if e["url"] == url))


def _wait_delivered(deployed: Deployment, job_id: str) -> dict[str, Any]:
    """The job's one delivery, once it is recorded as succeeded."""

    def delivered() -> dict[str, Any] | None:
        with deployed.client() as client:
            response = client.get("/v1/webhook-deliveries", params={"job_id": job_id})
        [delivery] = response.json()["data"]
        return delivery if delivery["state"] == "succeeded" else None

    return wait_until(delivered, timeout_s=30, what=f"{job_id} delivered", interval_s=0.2)


def test_webhooks_outlive_the_workers_and_their_wake_up_messages(
    deployment: DeploymentFactory,
) -> None:
    with receiver() as hooks:
        deployed = deployment()
        _service(deployed, "service").kill_group()  # nobody delivers for now
        cancelled_url, done_url = hooks.url("/cancelled"), hooks.url("/done")
        with deployed.client() as client:
            # No GPU worker yet: the job is surely still queued when it is cancelled.
            queued = client.post(
                "/v1/jobs", json={"prompt": "a", "max_tokens": 4, "webhook_url": cancelled_url}
            ).json()
            assert client.post(f"/v1/jobs/{queued['id']}/cancel").status_code == 200
            done = client.post(
                "/v1/jobs", json={"prompt": "b", "max_tokens": 4, "webhook_url": done_url}
            ).json()
        gpu = deployed.start_worker("gpu")
        deployed.wait_until(
            [done["id"]],
            lambda jobs: jobs[0].status is JobStatus.SUCCEEDED,
            timeout_s=120,
            what="succeeded",
        )
        gpu.kill_group()  # right after its commit
        # ... and the messages that would have woken the delivery worker are lost too.
        redis.Redis.from_url(deployed.env["INFERQ_REDIS_URL"]).delete(
            deployed.env["INFERQ_REDIS_KEY_PREFIX"] + WEBHOOKS_QUEUE
        )
        assert hooks.received() == []

        _start_service(deployed, "service-2")  # maintenance finds both in Postgres
        [cancelled] = hooks.wait_for("/cancelled", 1)
        [succeeded] = hooks.wait_for("/done", 1)
        payload = Webhook(_secret(deployed, cancelled_url)).verify(
            cancelled.body, cancelled.headers
        )
        assert (payload["type"], payload["data"]["id"]) == ("job.cancelled", queued["id"])
        payload = Webhook(_secret(deployed, done_url)).verify(succeeded.body, succeeded.headers)
        assert (payload["type"], payload["data"]["id"]) == ("job.succeeded", done["id"])
        # Both recorded as delivered, then several maintenance passes (each would wake the
        # delivery worker for anything still due): still once each.
        for job_id in (queued["id"], done["id"]):
            _wait_delivered(deployed, job_id)
        broker = Broker.of(deployed.env)
        try:
            broker.wait_maintenance_passes(3, timeout_s=30)
        finally:
            broker.close()
        assert len(hooks.received()) == 2


def test_a_delivery_worker_killed_mid_attempt_leaves_it_to_be_sent_again(
    deployment: DeploymentFactory,
) -> None:
    with receiver() as hooks:
        hooks.script("/slow", Reply(200, delay_s=2.5), Reply(200))
        deployed = deployment(INFERQ_WEBHOOK_TIMEOUT_S="3")
        with deployed.client() as client:
            job = client.post(
                "/v1/jobs",
                json={"prompt": "a", "max_tokens": 4, "webhook_url": hooks.url("/slow")},
            ).json()
            assert client.post(f"/v1/jobs/{job['id']}/cancel").status_code == 200
            hooks.wait_for("/slow", 1)
            _service(deployed, "service").kill_group()  # while the receiver is answering
            _start_service(deployed, "service-2")
            first, second = hooks.wait_for("/slow", 2, timeout_s=60)
            assert first.headers["webhook-id"] == second.headers["webhook-id"]
        delivery = _wait_delivered(deployed, job["id"])
        lost, delivered = delivery["attempts"]
        assert lost["status_code"] is None
        assert "stopped before this attempt ended" in lost["error"]
        assert delivered["status_code"] == 200
