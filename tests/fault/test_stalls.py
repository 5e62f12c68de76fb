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
from sqlalchemy import select

from inferq.broker.celery_app import make_celery
from inferq.constants import SERVICE_QUEUES
from inferq.domain.jobs import JobStatus
from inferq.domain.queue_names import gpu_queues
from inferq.host.stall import EXIT_STUCK
from inferq.host.supervision import EXIT_THREAD_DIED
from inferq.settings import Settings
from inferq.store.models import JobRow
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


def _batch(deployed: Deployment, lines: int, *, max_tokens: int = 8) -> str:
    body = "".join(
        json.dumps(
            {
                "custom_id": f"line-{i}",
                "method": "POST",
                "url": "/v1/completions",
                "body": {
                    "model": MODEL_NAME,
                    "prompt": f"line {i}",
                    "max_tokens": max_tokens,
                    "ignore_eos": True,
                },
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
    # Ready again from the watch's first reading after healing (it reads every few seconds).
    readyz = worker.metrics_url.removesuffix("/metrics") + "/readyz"
    worker.wait_until(lambda: httpx.get(readyz).text == "ready\n", timeout_s=15, what="ready")
    for process in (worker, service):
        assert process.alive(), process.log_tail()  # healed in place, not restarted
        assert log_contains(process, "is stuck: ")(), process.log_tail()
        # Said at the watch's first reading after the work it took again.
        process.wait_until(
            log_contains(process, "is taking work again"), timeout_s=15, what="taking work"
        )


def test_workers_that_die_or_cannot_heal_are_replaced_and_nothing_waits(
    deployment: DeploymentFactory,
) -> None:
    """Three partial failures in turn, each ended by the next worker as a restart policy
    would start it (one deployment, to spare CI three more model loads):
    1. gpu-a's result writer dies of an unexpected error: the worker exits with its code,
       where it once lived on with every task waiting on the dead thread forever;
    2. gpu-b's first claim raises: the room it took at the gate comes back (kept, a chunk
       as large as the gate would leave the worker taking nothing ever again), and the
       batch's lines all run;
    3. gpu-b's consumers are cancelled and its remote control refuses to consume again (as
       one whose control channel is gone): it exits with its code, and gpu-c runs what
       waited."""
    deployed = deployment(INFERQ_STALL_S=str(STALL_S))  # lines go 8 to a message
    first = deployed.start_worker("gpu-a", raise_once="announce")
    # Lines of one length end together: gpu-a's first write (a full engine, 16 lines)
    # commits and dies announcing them, and 32 lines are left to the next worker.
    batch_id = _batch(deployed, 48, max_tokens=32)
    assert _exit_code(first, BOUND_S) == EXIT_THREAD_DIED
    said = first.log_path.read_text()
    assert "thread result-writer died of an unexpected error" in said
    assert "InjectedFault: injected into JobEvents.finished" in said  # the traceback

    # Room for 8 jobs (4 in the engine, 4 waiting): one chunk of lines fills it.
    second = deployed.start_worker(
        "gpu-b",
        raise_once="claim",
        deaf_control=True,
        INFERQ_MAX_NUM_SEQS="4",
        INFERQ_MAX_BATCH_SIZE="4",
    )
    _wait_batch_completed(deployed, batch_id, BOUND_S)
    assert log_contains(second, "InjectedFault: injected into JobStore.claim_jobs")()

    _cancel_consumers(_control(deployed), "gpu-b@test", gpu_queues(MODEL_NAME))
    ids = deployed.submit(_jobs(4))
    assert _exit_code(second, BOUND_S) == EXIT_STUCK
    assert log_contains(second, "healing did not help")(), second.log_tail()
    deployed.start_worker("gpu-c")
    jobs = deployed.wait_all_ended(ids, timeout_s=BOUND_S)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 4


def test_a_worker_whose_peers_take_all_its_work_is_noticed_and_takes_its_share_again(
    deployment: DeploymentFactory,
) -> None:
    """Three workers of one model: gpu-a's consumers are cancelled while gpu-b and gpu-c
    keep the queue empty, so nothing waits in Redis. gpu-a is noticed from its peers'
    heartbeats, consumes again and runs jobs, within the bound, in place. (gpu-b and
    gpu-c only keep the queue empty, on the pipeline-only engine; gpu-a runs the model.)"""
    deployed = deployment(INFERQ_STALL_S=str(STALL_S))
    stuck = deployed.start_worker("gpu-a")
    _cancel_consumers(_control(deployed), "gpu-a@test", gpu_queues(MODEL_NAME))
    for name in ("gpu-b", "gpu-c"):
        deployed.start_worker(
            name, INFERQ_ENGINE="pipeline-only", INFERQ_ALLOW_BENCHMARK_ENGINE="true"
        )
    started = time.monotonic()
    ran_on_a: list[str] = []
    # A trickle: each round ends before the next is sent, so the queue stays empty.
    while not ran_on_a:
        assert time.monotonic() - started < BOUND_S, stuck.log_tail()
        ids = deployed.submit(_jobs(6))
        jobs = deployed.wait_all_ended(ids, timeout_s=BOUND_S)
        assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 6
        with deployed.sessions() as session:
            ran_on_a += session.scalars(
                select(JobRow.id).where(JobRow.id.in_(ids), JobRow.worker == "gpu-a@test")
            ).all()
    said = stuck.log_path.read_text()
    assert "taken by its peers meanwhile" in said, stuck.log_tail()
    assert stuck.alive(), stuck.log_tail()  # healed in place, not restarted
