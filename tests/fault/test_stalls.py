"""Partial failures: a process that lives on, answers its pings and renews its leases, yet
does nothing. Each test injects one from outside (Celery's own remote control) or through
tests/helpers/faulty_worker.py, and checks that every job still ends within a stated
bound, with no human action."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Sequence

import httpx
import pytest
from celery import Celery
from openai import OpenAI

from inferq.broker.celery_app import make_celery
from inferq.constants import SERVICE_QUEUES
from inferq.domain.jobs import JobStatus
from inferq.domain.queue_names import gpu_queues
from inferq.host.stall import EXIT_STUCK
from inferq.host.supervision import EXIT_THREAD_DIED
from inferq.settings import Settings
from tests.conftest import MODEL_NAME
from tests.fault.conftest import DeploymentFactory
from tests.helpers.deployment import Deployment
from tests.helpers.processes import ServiceProcess, log_contains
from tests.helpers.receiver import receiver

pytestmark = pytest.mark.engine

STALL_S = 10
# What a stuck process may cost a job: a stall bound to notice, readings and healing
# within a second bound, then the work itself on a slow two-core host.
BOUND_S = 2 * STALL_S + 90


def _jobs(count: int, **extra: object) -> list[dict[str, object]]:
    return [{"prompt": f"job {i}", "max_tokens": 8, **extra} for i in range(count)]


def _control(deployed: Deployment) -> Celery:
    env = deployed.env
    return make_celery(
        Settings(redis_url=env["INFERQ_REDIS_URL"], redis_key_prefix=env["INFERQ_REDIS_KEY_PREFIX"])
    )


def _cancel_consumers(control: Celery, node: str, queues: Sequence[str]) -> None:
    for queue in queues:
        replies = control.control.cancel_consumer(queue, destination=[node], reply=True)
        assert replies, f"{node} did not answer"
        assert "ok" in replies[0][node], replies


def _batch(deployed: Deployment, lines: int) -> str:
    body = "".join(
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"model": MODEL_NAME, "prompt": f"line {i}", "max_tokens": 8},
            }
        )
        + "\n"
        for i in range(lines)
    )
    client = OpenAI(base_url=f"{deployed.url}/v1", api_key=deployed.admin_key)
    uploaded = client.files.create(file=("lines.jsonl", io.BytesIO(body.encode())), purpose="batch")
    batch = client.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/completions", completion_window="24h"
    )
    return batch.id


def _wait_batch_completed(deployed: Deployment, batch_id: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with deployed.client() as client:
        while (status := client.get(f"/v1/batches/{batch_id}").json()["status"]) != "completed":
            assert time.monotonic() < deadline, f"batch {batch_id} still {status}"
            time.sleep(0.5)


def _exit_code(process: ServiceProcess, timeout_s: float) -> int:
    return process.process.wait(timeout=timeout_s)


def test_cancelled_consumers_are_noticed_and_consume_again(deployment: DeploymentFactory) -> None:
    """The GPU worker's and the webhooks worker's consumers cancelled, as an operator's
    `celery control cancel_consumer` does: both notice and consume again themselves."""
    deployed = deployment(INFERQ_STALL_S=str(STALL_S))
    worker = deployed.start_worker("gpu-a")
    service = next(p for p in deployed.processes if p.name == "service")
    control = _control(deployed)
    _cancel_consumers(control, "gpu-a@test", gpu_queues(MODEL_NAME))
    _cancel_consumers(control, "service@test", SERVICE_QUEUES)
    with receiver() as hooks:
        started = time.monotonic()
        ids = deployed.submit(_jobs(20, webhook_url=hooks.url("/done")))
        batch_id = _batch(deployed, 20)
        jobs = deployed.wait_all_ended(ids, timeout_s=BOUND_S)
        _wait_batch_completed(deployed, batch_id, BOUND_S - (time.monotonic() - started))
        hooks.wait_for("/done", 20, timeout_s=BOUND_S - (time.monotonic() - started))

    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 20
    probes = worker.metrics_url.removesuffix("/metrics")
    assert httpx.get(f"{probes}/readyz").text == "ready\n"
    for process in (worker, service):
        assert process.alive(), process.log_tail()  # healed in place, not restarted
        assert log_contains(process, "is stuck: ")(), process.log_tail()
        assert log_contains(process, "is taking work again")(), process.log_tail()


def test_a_result_writer_that_dies_ends_its_worker(deployment: DeploymentFactory) -> None:
    """An unexpected error in the writer's thread: the worker exits with its code (where
    it once hung on with every task waiting), and a restarted one ends every job."""
    deployed = deployment()
    worker = deployed.start_worker("gpu-a", raise_once="announce")
    ids = deployed.submit(_jobs(10))
    assert _exit_code(worker, BOUND_S) == EXIT_THREAD_DIED
    said = worker.log_path.read_text()
    assert "thread result-writer died of an unexpected error" in said
    assert "InjectedFault: injected into JobEvents.finished" in said  # the traceback
    deployed.start_worker("gpu-b")  # as compose's restart policy or Kubernetes would
    jobs = deployed.wait_all_ended(ids, timeout_s=BOUND_S)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 10


def test_a_claim_that_raises_gives_its_room_back(deployment: DeploymentFactory) -> None:
    """A chunk as large as the worker's whole gate whose claim raises: its room comes back
    (kept, the worker would take nothing ever again) and its lines run."""
    deployed = deployment(INFERQ_STALL_S=str(STALL_S))
    # Room for 8 jobs (4 in the engine, 4 waiting), and chunks of 8 lines.
    worker = deployed.start_worker(
        "gpu-a",
        raise_once="claim",
        INFERQ_MAX_NUM_SEQS="4",
        INFERQ_MAX_BATCH_SIZE="4",
        INFERQ_BULK_CHUNK_SIZE="8",
    )
    batch_id = _batch(deployed, 24)
    _wait_batch_completed(deployed, batch_id, BOUND_S)
    assert worker.alive(), worker.log_tail()
    assert log_contains(worker, "InjectedFault")(), worker.log_tail()


def test_a_stuck_worker_that_cannot_heal_exits(deployment: DeploymentFactory) -> None:
    """Consuming again does not help when the worker's remote control refuses it (as one
    whose control channel is gone would): the worker gives its jobs back and exits with
    its code, to be restarted."""
    deployed = deployment(INFERQ_STALL_S=str(STALL_S))
    worker = deployed.start_worker("gpu-a", deaf_control=True)
    _cancel_consumers(_control(deployed), "gpu-a@test", gpu_queues(MODEL_NAME))
    ids = deployed.submit(_jobs(4))
    assert _exit_code(worker, BOUND_S) == EXIT_STUCK
    assert log_contains(worker, "healing did not help")(), worker.log_tail()
    deployed.start_worker("gpu-b")
    jobs = deployed.wait_all_ended(ids, timeout_s=BOUND_S)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 4
