"""What KEDA reads to scale a model's workers (deploy/k8s/scaledobject-*.yaml): the count its
query returns from a real, migrated Postgres holding that model's jobs waiting and held,
another model's, and jobs that have ended; and the index that keeps the query cheap."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from sqlalchemy import Engine

from inferq.domain.jobs import (
    ACTIVE_STATUSES,
    TERMINAL_STATUSES,
    JobError,
    JobOutcome,
    JobSpec,
    JobStatus,
)
from inferq.domain.queue_names import bulk_queue, interactive_queue
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore, NewJob
from tests.helpers.jobs import create_jobs, job_result, job_spec

K8S = Path(__file__).resolve().parents[3] / "deploy" / "k8s"


def _query() -> str:
    scaled = yaml.safe_load((K8S / "scaledobject-llama.yaml").read_text())
    [trigger] = scaled["spec"]["triggers"]
    assert trigger["type"] == "postgresql"
    query: str = trigger["metadata"]["query"]
    return query


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    engine = make_database(database_url, pool_size=1)
    yield engine
    engine.dispose()


def _spec(model: str, *, base: str | None = None) -> JobSpec:
    return dataclasses.replace(job_spec(), model=model, base=base)


def _single(store: JobStore, specs: list[JobSpec]) -> list[str]:
    """Single jobs, each on its served model's interactive queue, as the API writes them."""
    jobs = store.submit_jobs(
        [NewJob(spec=spec, tenant="t") for spec in specs],
        queue=lambda spec: interactive_queue(spec.served_by),
        requeue_after_s=3600,
    )
    return [job.id for job in jobs]  # type: ignore[union-attr]


def test_the_query_counts_the_model_s_jobs_queued_and_running_and_nothing_else(
    engine: Engine,
) -> None:
    store = JobStore(make_sessions(engine))
    # llama's work: single jobs (one for its LoRA adapter, which llama's workers run) and
    # batch lines (on its bulk queue), some waiting, some held by a worker under a lease.
    waiting = _single(store, [_spec("llama"), _spec("llama"), _spec("llama-sql", base="llama")])
    lines = [job.id for job in create_jobs(store, [_spec("llama")] * 4, queue=bulk_queue("llama"))]
    held = [waiting[0], *lines[:2]]
    assert len(store.claim_jobs(held, worker="gpu-a@llama", lease_s=600)) == 3
    # llama's jobs that have ended, each way a job ends.
    ended = _single(store, [_spec("llama")] * 3)
    store.claim_jobs(ended[:2], worker="gpu-a@llama", lease_s=600)
    store.finish_jobs(
        [
            JobOutcome(job_id=ended[0], result=job_result()),
            JobOutcome(job_id=ended[1], error=JobError(code="engine_rejected", message="no")),
        ]
    )
    store.cancel_job(ended[2])
    # Another model's work, waiting and held: a batch of hundreds of lines among it, so
    # the table holds llama's few active jobs among many, as a busy deployment's does.
    other = _single(store, [_spec("mistral"), _spec("mistral")])
    store.claim_jobs(other[:1], worker="gpu-b@mistral", lease_s=600)
    create_jobs(store, [_spec("mistral")] * 500, queue=bulk_queue("mistral"))

    truth = [*waiting, *lines]
    statuses = [job.status for job in store.get_jobs(truth)]
    assert set(statuses) == ACTIVE_STATUSES
    assert statuses.count(JobStatus.RUNNING) == len(held)
    assert {job.status for job in store.get_jobs(ended)} == TERMINAL_STATUSES

    with engine.connect() as connection:
        # As KEDA sends it: the text alone, without parameters.
        count = connection.exec_driver_sql(_query()).scalar_one()
        connection.exec_driver_sql("ANALYZE jobs")  # as autovacuum would have by now
        plan = "\n".join(connection.exec_driver_sql(f"EXPLAIN {_query()}").scalars())
    assert count == len(truth) == 7
    # Read from the index of active jobs by queue: llama's entries, not the table.
    assert "ix_jobs_queue_active" in plan, plan
    assert "Seq Scan" not in plan, plan
