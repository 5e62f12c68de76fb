"""A GPU worker killed outright: its jobs come back through their leases and run to
exactly one result. Assertions are on Postgres rows."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter

import pytest
from sqlalchemy import func, select

from inferq.domain.jobs import JobStatus
from inferq.store.models import JobRow, WebhookAttemptRow, WebhookDeliveryRow
from tests.fault.conftest import DeploymentFactory
from tests.helpers.broker import Broker
from tests.helpers.deployment import Deployment
from tests.helpers.receiver import Received, receiver

pytestmark = pytest.mark.engine


def _bodies(count: int, tokens: int) -> list[dict[str, object]]:
    return [
        {"prompt": f"job {i}", "max_tokens": tokens, "ignore_eos": True, "temperature": 0}
        for i in range(count)
    ]


def _job_id(request: Received) -> str:
    return str(json.loads(request.body)["data"]["id"])


# Long enough that a quick machine still has jobs running when a wave has ended.
TOKENS = 300


def test_sigkill_with_200_jobs_in_flight_loses_nothing(deployment: DeploymentFactory) -> None:
    with receiver() as hooks:
        deployed = deployment()
        bodies = [{**body, "webhook_url": hooks.url("/done")} for body in _bodies(200, TOKENS)]
        # Queued before the worker starts, so that it has a backlog to hold when killed
        # (on a loaded machine submitting can be slower than running).
        ids = deployed.submit(bodies)
        # Waves of 32: a fast host runs 200 jobs of 64 in a few seconds, and could end
        # its last wave between the look that saw jobs running and the kill.
        first = deployed.start_worker("gpu-a", INFERQ_MAX_NUM_SEQS="32", INFERQ_MAX_BATCH_SIZE="32")
        deployed.wait_done_and_running(ids, 32)
        running_at_kill = deployed.kill_holding_running_jobs(first, ids)
        deployed.start_worker("gpu-b", INFERQ_MAX_NUM_SEQS="64", INFERQ_MAX_BATCH_SIZE="32")
        jobs = deployed.wait_all_ended(ids)

        assert running_at_kill > 0
        assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 200
        assert all(j.result is not None and j.result.completion_tokens == TOKENS for j in jobs)
        # The jobs the dead worker held ran again, and still have one result each ...
        assert Counter(j.attempts for j in jobs)[2] >= running_at_kill
        # ... and one webhook each: one outbox row per job, so one webhook-id per job.
        # Delivery is at least once: a job is sent again only after a failed attempt (under
        # load the receiver can miss the 2 s timeout), and with the same webhook-id.
        received = hooks.wait_until(
            "/done", lambda got: {_job_id(r) for r in got} >= set(ids), timeout_s=120
        )
        with deployed.sessions() as session:
            rows = session.execute(
                select(WebhookDeliveryRow.job_id, WebhookDeliveryRow.id).where(
                    WebhookDeliveryRow.job_id.in_(ids)
                )
            ).all()
            failed = set(
                session.scalars(
                    select(WebhookDeliveryRow.job_id)
                    .join(WebhookAttemptRow)
                    .where(WebhookDeliveryRow.job_id.in_(ids), WebhookAttemptRow.error.is_not(None))
                )
            )
        assert Counter(job for job, _ in rows) == Counter(ids)
        delivery_of = dict(rows)
        assert all(r.headers["webhook-id"] == delivery_of[_job_id(r)] for r in received)
        sent_again = {job for job, n in Counter(_job_id(r) for r in received).items() if n > 1}
        assert sent_again <= failed


def test_sigkill_while_jobs_wait_for_admission_loses_nothing(
    deployment: DeploymentFactory,
) -> None:
    deployed = deployment()
    # Two sequences in the engine, 64 messages held: most held work waits for admission
    # (its messages taken from Redis, its jobs claimed or waiting to be).
    first = deployed.start_worker(
        "gpu-a", INFERQ_MAX_NUM_SEQS="2", INFERQ_MAX_BATCH_SIZE="2", INFERQ_WORKER_CONCURRENCY="64"
    )
    # Frozen while the jobs are submitted: it finds a backlog, which on a loaded machine
    # it would not (submitting can be slower than running).
    with first.frozen():
        ids = deployed.submit(_bodies(150, 64))
    broker = Broker.of(deployed.env)

    def taken() -> int:
        """Jobs in the messages the worker has taken and not acknowledged; jobs
        submitted together share a message."""
        return len(broker.held_jobs())

    # Killed once far more jobs are taken than the engine has room for (and some are done).
    deployed.wait_done_count(ids, 1)
    deadline = time.monotonic() + 60
    try:
        while (held := taken()) <= 20:
            assert time.monotonic() < deadline, f"the worker took only {held} jobs"
    finally:
        broker.close()
    first.kill_group()
    held = [j for j in deployed.jobs(ids) if j.status is JobStatus.RUNNING]
    deployed.start_worker("gpu-b")
    jobs = deployed.wait_all_ended(ids)

    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 150
    assert all(j.result is not None and j.result.completion_tokens == 64 for j in jobs)
    by_id = {j.id: j for j in jobs}
    assert all(by_id[j.id].attempts == 2 for j in held)


def test_two_workers_share_a_queue_and_one_takes_over_from_the_other(
    deployment: DeploymentFactory,
) -> None:
    deployed = deployment()
    first = deployed.start_worker("gpu-a", wait=False)
    second = deployed.start_worker("gpu-b", wait=False)
    from tests.helpers.processes import wait_worker_ready

    wait_worker_ready(first)
    wait_worker_ready(second)

    ids = deployed.submit(_bodies(200, 32))
    jobs = deployed.wait_all_ended(ids)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 200
    assert all(j.attempts == 1 for j in jobs)  # each ran exactly once
    with deployed.sessions() as session:
        workers = Counter(session.scalars(select(JobRow.worker).where(JobRow.id.in_(ids))))
    assert set(workers) == {"gpu-a@test", "gpu-b@test"}

    # Both workers frozen while the jobs are submitted: they find a backlog, which on a
    # loaded machine they would not (submitting can be slower than running).
    for worker in (first, second):
        worker.signal(signal.SIGSTOP)
    try:
        more = deployed.submit(_bodies(150, 48))
    finally:
        for worker in (first, second):
            worker.signal(signal.SIGCONT)
    # Kill the second worker while it holds jobs, so there is something to take over. As
    # soon as it holds some: waiting for others to end first raced the whole backlog,
    # which a worker can finish in seconds (seen on a loaded machine).
    _wait_for_running_jobs(deployed, more, worker="gpu-b@test")
    second.kill_group()
    jobs = deployed.wait_all_ended(more)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 150
    with deployed.sessions() as session:
        retried = session.scalars(
            select(JobRow.worker).where(JobRow.id.in_(more), JobRow.attempts > 1)
        ).all()
    assert retried
    assert set(retried) == {"gpu-a@test"}


def _wait_for_running_jobs(
    deployed: Deployment, ids: list[str], *, worker: str, timeout_s: float = 120
) -> None:
    query = select(func.count()).where(
        JobRow.id.in_(ids), JobRow.worker == worker, JobRow.status == JobStatus.RUNNING.value
    )
    deadline = time.monotonic() + timeout_s
    while True:
        with deployed.sessions() as session:
            if session.scalar(query):
                return
        assert time.monotonic() < deadline, f"{worker} never held any of the jobs"
        time.sleep(0.05)
