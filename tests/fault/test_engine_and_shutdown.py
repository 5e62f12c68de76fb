"""A request that kills vLLM's engine, and a worker told to stop: the worker survives
the first, drains on the second, and no job is lost or failed wrongly."""

from __future__ import annotations

import signal
import time
from datetime import UTC, datetime

import pytest
import redis

from housekeeper.maintenance import _job_ids
from inferq.domain.jobs import JobStatus
from inferq.domain.queue_names import interactive_queue
from tests.conftest import MODEL_NAME
from tests.fault.conftest import DeploymentFactory

pytestmark = pytest.mark.engine

POISON_SEED = 666


def _bodies(count: int, tokens: int) -> list[dict[str, object]]:
    return [{"prompt": f"job {i}", "max_tokens": tokens, "ignore_eos": True} for i in range(count)]


def test_a_request_that_kills_the_engine_fails_alone(deployment: DeploymentFactory) -> None:
    # The fault hook (tests/helpers/faulty_worker.py): a request with this seed SIGKILLs
    # vLLM's engine core when admitted.
    deployed = deployment()
    worker = deployed.start_worker("gpu-a", kill_engine_seed=POISON_SEED)
    pid = worker.pid
    neighbours = deployed.submit(_bodies(8, 300))
    [poison] = deployed.submit(
        [{"prompt": "poison", "max_tokens": 300, "ignore_eos": True, "seed": POISON_SEED}]
    )
    later = deployed.submit(_bodies(8, 16))
    jobs = {j.id: j for j in deployed.wait_all_ended([*neighbours, poison, *later], timeout_s=420)}

    failed = jobs.pop(poison)
    assert failed.status is JobStatus.FAILED
    assert failed.error is not None
    assert failed.error.code == "engine_crash"
    assert "died 3 times" in failed.error.message
    assert [j.status for j in jobs.values()] == [JobStatus.SUCCEEDED] * len(jobs)
    # The worker restarted its engine, not itself ...
    assert worker.alive()
    assert worker.pid == pid
    # ... and stops cleanly, the engine it built after the crashes included.
    worker.signal(signal.SIGTERM)
    assert worker.process.wait(60) == 0


def test_sigterm_finishes_in_flight_work_and_returns_the_rest(
    deployment: DeploymentFactory,
) -> None:
    deployed = deployment()
    worker = deployed.start_worker(
        "gpu-a",
        INFERQ_MAX_NUM_SEQS="4",
        INFERQ_MAX_BATCH_SIZE="4",
        INFERQ_WORKER_CONCURRENCY="32",
        INFERQ_DRAIN_TIMEOUT_S="60",
    )
    # 900 tokens a job: ten waves of four that a quick machine does not finish before one
    # has ended and more are running.
    ids = deployed.submit(_bodies(40, 900))
    deployed.wait_done_and_running(ids, 1)
    stopped_at = datetime.now(UTC)
    worker.signal(signal.SIGTERM)
    started = time.monotonic()
    exit_code = worker.process.wait(90)
    drained_in = time.monotonic() - started
    jobs = deployed.jobs(ids)

    assert exit_code == 0
    assert drained_in < 60
    statuses = {j.status for j in jobs}
    assert statuses <= {JobStatus.SUCCEEDED, JobStatus.QUEUED}  # nothing failed or stuck
    finished_while_draining = [
        j for j in jobs if j.status is JobStatus.SUCCEEDED and j.finished_at > stopped_at
    ]
    returned = [j for j in jobs if j.status is JobStatus.QUEUED]
    assert finished_while_draining  # the engine's work was finished, not thrown away
    # The jobs waiting for the engine went back: more than the engine had room for.
    assert len(returned) > 4
    # Their messages went back to Redis too, ready for the next worker (jobs submitted
    # together share a message).
    client = redis.Redis.from_url(deployed.env["INFERQ_REDIS_URL"])
    raw = client.lrange(
        deployed.env["INFERQ_REDIS_KEY_PREFIX"] + interactive_queue(MODEL_NAME), 0, -1
    )
    waiting = {job_id for message in raw for job_id in _job_ids(message)}
    assert {j.id for j in returned} <= waiting

    deployed.start_worker("gpu-b")
    jobs = deployed.wait_all_ended(ids)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 40
