"""Redis losing everything and Postgres restarting under load: every job still ends with
one result. Each test runs its own server to flush or restart."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from openai import OpenAI

from inferq.constants import JOB_ID_PREFIX
from inferq.domain.jobs import JobStatus
from tests.conftest import MODEL_NAME
from tests.fault.conftest import DeploymentFactory
from tests.helpers.processes import log_contains
from tests.helpers.servers import PostgresServer, RedisServer

pytestmark = pytest.mark.engine


def _bodies(count: int, tokens: int) -> list[dict[str, object]]:
    return [{"prompt": f"job {i}", "max_tokens": tokens, "ignore_eos": True} for i in range(count)]


def test_flushall_on_redis_mid_run_loses_nothing(
    own_redis: str, deployment: DeploymentFactory
) -> None:
    deployed = deployment(redis_url=own_redis)
    # Two messages held at once: a message carries every job submitted together (up to the
    # 32 the client sends at a time), and the default holds enough of them to take all 300
    # jobs before 10 have ended on a quick machine, leaving nothing in Redis to flush.
    deployed.start_worker("gpu-a", INFERQ_WORKER_CONCURRENCY="2")
    ids = deployed.submit(_bodies(300, 200))
    deployed.wait_done_count(ids, 10)
    queued = sum(1 for j in deployed.jobs(ids) if j.status is JobStatus.QUEUED)
    redis.Redis.from_url(own_redis).flushall()
    jobs = deployed.wait_all_ended(ids)

    assert queued > 20  # the flush took their messages
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 300
    assert all(j.result is not None and j.result.completion_tokens == 200 for j in jobs)


def test_redis_restarted_empty_leaves_the_worker_serving_and_loses_nothing(
    own_redis_server: RedisServer, deployment: DeploymentFactory
) -> None:
    """Redis stopped and started again without its data (an upgrade, a failover without
    persistence), three times while jobs run: the GPU worker reconnects in the same
    process, its engine loaded, and every job ends."""
    deployed = deployment(redis_url=own_redis_server.url)
    worker = deployed.start_worker("gpu-a")
    ids = deployed.submit(_bodies(60, 100))
    deployed.wait_done_and_running(ids, 5)
    probes: list[str] = []
    for restart in range(1, 4):
        own_redis_server.kill()
        own_redis_server.start()
        # Serving again: a job submitted now runs (this raises if the worker exits instead).
        [probe] = deployed.submit(_bodies(1, 8))
        probes.append(probe)
        worker.wait_until(
            lambda probe=probe: deployed.jobs([probe])[0].status is JobStatus.SUCCEEDED,
            timeout_s=120,
            what=f"serving after restart {restart}",
        )
    more = deployed.submit(_bodies(5, 8))
    jobs = deployed.wait_all_ended([*ids, *probes, *more])

    assert worker.alive()
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 68
    assert all(j.result is not None for j in jobs)


def test_online_requests_wait_out_a_postgres_restart(
    own_postgres: PostgresServer, deployment: DeploymentFactory
) -> None:
    """A chat answered when it ends, and one streamed, both waiting on their jobs while
    Postgres restarts: both are answered in full (found by bench/chaos: 503s and streams
    cut without an error event at every Postgres restart)."""
    deployed = deployment(database_url=own_postgres.url("inferq"))
    worker = deployed.start_worker("gpu-a")
    api = deployed.processes[0]
    client = OpenAI(base_url=f"{deployed.url}/v1", api_key=deployed.admin_key, max_retries=0)
    body: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 16,
        "extra_body": {"ignore_eos": True},
    }

    def streamed() -> tuple[str, str]:
        chunks = list(client.chat.completions.create(**body, stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return chunks[0].id, text

    with ThreadPoolExecutor(2) as pool, worker.frozen():
        answered = pool.submit(client.chat.completions.create, **body)
        stream = pool.submit(streamed)
        api.wait_until(lambda: _jobs_in(own_postgres) == 2, timeout_s=60, what="storing both")
        own_postgres.stop(mode="immediate")
        # The stream has found the database gone (or the chat, failing, been answered); the
        # chat reads its job only when woken, and nothing wakes it before the restart.
        api.wait_until(
            lambda: answered.done() or _log_count(api.log_path, "waiting for the database") >= 1,
            timeout_s=60,
            what="meeting the outage",
        )
        own_postgres.start()

    chat = answered.result(timeout=120)
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 16
    stream_id, text = stream.result(timeout=120)
    [stored] = deployed.jobs([JOB_ID_PREFIX + stream_id.removeprefix("chatcmpl-")])
    assert stored.result is not None
    assert text == stored.result.choices[0].text


def _jobs_in(server: PostgresServer) -> int:
    with psycopg.connect(server.url("inferq").replace("+psycopg", "")) as connection:
        row = connection.execute("SELECT count(*) FROM jobs").fetchone()
    return 0 if row is None else int(row[0])


def _log_count(log: Path, text: str) -> int:
    return log.read_text(errors="replace").count(text)


def test_a_postgres_restart_mid_write_loses_nothing_and_fails_nothing(
    own_postgres: PostgresServer, deployment: DeploymentFactory
) -> None:
    deployed = deployment(database_url=own_postgres.url("inferq"))
    worker = deployed.start_worker("gpu-a")
    # Frozen while the jobs are submitted: on a loaded machine submitting 150 jobs can take
    # longer than running them, and none would be left running to catch.
    with worker.frozen():
        ids = deployed.submit(_bodies(150, 200))
    deployed.wait_done_and_running(ids, 30)
    # Postgres stops while the worker (and its engine) is frozen holding running jobs: they
    # are still to be written when it goes on, however fast the tiny model runs here.
    with worker.frozen():
        held = sum(1 for j in deployed.jobs(ids) if j.status is JobStatus.RUNNING)
        own_postgres.stop()
    assert held > 0
    # Down until the worker has failed to write results (it keeps them and retries).
    worker.wait_until(
        log_contains(worker, "cannot write"), timeout_s=120, what="meeting the outage"
    )
    own_postgres.start()
    jobs = deployed.wait_all_ended(ids)

    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 150
    assert all(j.result is not None and j.result.completion_tokens == 200 for j in jobs)
    # The worker rode it out: the same process, still serving.
    assert worker.alive()
    more = deployed.submit(_bodies(5, 8))
    assert [j.status for j in deployed.wait_all_ended(more)] == [JobStatus.SUCCEEDED] * 5
