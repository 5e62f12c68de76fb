"""The job store on a real Postgres database of the test's own, and the same tests on
SQLite (the store behind `inferq run`), migrated by the same Alembic migrations."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import psycopg
import pytest
from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError

from inferq.domain.jobs import (
    Choice,
    Job,
    JobError,
    JobOutcome,
    JobResult,
    JobSpec,
    JobStatus,
    SamplingParams,
)
from inferq.exceptions import InvalidState, NotFound, StoreUnavailable
from inferq.store.database import make_database, make_sessions
from inferq.store.job_rows import new_job_id
from inferq.store.jobs import JobStore, NewJob
from inferq.store.text_codec import ESCAPE
from tests.helpers.clock import Clock
from tests.helpers.jobs import create_jobs


@pytest.fixture
def store(store_url: str, clock: Clock) -> Iterator[JobStore]:
    engine = make_database(store_url, pool_size=2)
    yield JobStore(make_sessions(engine), clock=clock)
    engine.dispose()


def _spec(prompt: str = "hi") -> JobSpec:
    return JobSpec(
        model="tiny",
        prompt=prompt,
        messages=None,
        prompt_token_ids=[0, 5, 6],
        sampling=SamplingParams(max_tokens=8, stop=("x",), seed=3),
        metadata={"k": "v"},
    )


def _result(text: str = "out") -> JobResult:
    return JobResult(
        choices=(Choice(index=0, text=text, finish_reason="stop", completion_tokens=2),),
        prompt_tokens=3,
    )


def test_created_jobs_read_back_as_written(store: JobStore) -> None:
    [job] = create_jobs(store, [_spec()], queue="interactive")
    read = store.get_job(job.id)
    assert read == job
    assert read.status is JobStatus.QUEUED
    assert read.sampling.stop == ("x",)
    assert read.metadata == {"k": "v"}


def test_jobs_submitted_together_read_back_as_written_and_are_written_all_or_none(
    store: JobStore,
) -> None:
    tricky = f"a\x00b{ESCAPE}0"
    specs = [
        _spec(),
        replace(_spec(tricky), metadata={f"k\x00{ESCAPE}": tricky}),
        replace(_spec(), prompt=None, messages=[{"role": "user", "content": tricky}]),
    ]
    jobs = create_jobs(store, specs, queue="interactive")
    assert [store.get_job(job.id) for job in jobs] == jobs
    # One of a group is refused (its id is taken): none of the others is written.
    again = [NewJob(spec=_spec(), tenant="t", id=new_job_id()) for _ in range(2)]
    again.insert(1, NewJob(spec=_spec(), tenant="t", id=jobs[0].id))
    with pytest.raises((IntegrityError, psycopg.errors.UniqueViolation)):
        store.submit_jobs(again, queue="interactive", requeue_after_s=60)
    for new in again[::2]:
        assert new.id is not None
        with pytest.raises(NotFound):
            store.get_job(new.id)


def test_an_unknown_job_is_not_found(store: JobStore) -> None:
    with pytest.raises(NotFound):
        store.get_job("job_nope")


def test_claim_returns_token_ids_and_takes_each_job_once(store: JobStore) -> None:
    jobs = create_jobs(store, [_spec(), _spec()], queue="bulk")
    ids = [j.id for j in jobs]
    claimed = store.claim_jobs(ids, worker="w1", lease_s=30)
    assert [c.id for c in claimed] == ids
    assert claimed[0].prompt_token_ids == [0, 5, 6]
    assert store.claim_jobs(ids, worker="w2", lease_s=30) == []
    assert store.get_job(ids[0]).status is JobStatus.RUNNING


def test_a_job_whose_lease_ran_out_can_be_claimed_again(store: JobStore, clock: Clock) -> None:
    [job] = create_jobs(store, [_spec()], queue="interactive")
    store.claim_jobs([job.id], worker="dead", lease_s=30)
    clock.now += timedelta(seconds=31)
    assert [c.id for c in store.claim_jobs([job.id], worker="alive", lease_s=30)] == [job.id]
    assert store.renew_leases([job.id], worker="dead", lease_s=30) == {job.id}
    assert store.renew_leases([job.id], worker="alive", lease_s=30) == set()


def test_renewal_takes_back_own_jobs_requeued_during_an_outage(
    store: JobStore, clock: Clock
) -> None:
    [job] = create_jobs(store, [_spec()], queue="interactive")
    store.claim_jobs([job.id], worker="w", lease_s=30)
    clock.now += timedelta(seconds=31)
    assert [d.id for d in store.take_due(requeue_after_s=60, limit=10)] == [job.id]
    assert store.renew_leases([job.id], worker="w", lease_s=30) == set()
    assert store.get_job(job.id).status is JobStatus.RUNNING
    # The duplicate message published meanwhile finds the job held.
    assert store.claim_jobs([job.id], worker="other", lease_s=30) == []


def test_results_are_written_once_and_only_for_active_jobs(store: JobStore) -> None:
    a, b, c = create_jobs(store, [_spec(), _spec(), _spec()], queue="bulk")
    store.claim_jobs([a.id, b.id, c.id], worker="w", lease_s=30)
    store.cancel_job(c.id)
    written = store.finish_jobs(
        [
            JobOutcome(job_id=a.id, result=_result("first")),
            JobOutcome(job_id=b.id, error=JobError(code="engine_rejected", message="no")),
            JobOutcome(job_id=c.id, result=_result("too late")),
        ]
    )
    assert written == [a.id, b.id]
    # A second run of the same job (a redelivered message) changes nothing.
    assert store.finish_jobs([JobOutcome(job_id=a.id, result=_result("second"))]) == []
    done = store.get_job(a.id)
    assert done.status is JobStatus.SUCCEEDED
    assert done.result is not None
    assert done.result.choices[0].text == "first"
    assert store.get_job(b.id).error == JobError(code="engine_rejected", message="no")
    assert store.get_job(c.id).status is JobStatus.CANCELLED
    assert store.get_job(c.id).result is None


def test_hundreds_of_results_written_at_once_each_land_on_their_own_job(
    store: JobStore,
) -> None:
    jobs = create_jobs(store, [_spec()] * 300, queue="bulk")
    ids = [job.id for job in jobs]
    store.claim_jobs(ids, worker="w", lease_s=30)
    outcomes = [
        JobOutcome(job_id=job_id, result=_result(f"text {i}"))
        if i % 3
        else JobOutcome(job_id=job_id, error=JobError(code="engine_rejected", message=f"no {i}"))
        for i, job_id in enumerate(ids)
    ]
    assert store.finish_jobs(outcomes) == ids
    for i, job_id in enumerate(ids):
        job = store.get_job(job_id)
        assert job.finished_at is not None
        if i % 3:
            assert job.status is JobStatus.SUCCEEDED
            assert job.result is not None
            assert job.result.choices[0].text == f"text {i}"
        else:
            assert job.status is JobStatus.FAILED
            assert job.error == JobError(code="engine_rejected", message=f"no {i}")


def test_a_finished_job_cannot_be_claimed_or_cancelled(store: JobStore) -> None:
    [job] = create_jobs(store, [_spec()], queue="interactive")
    store.claim_jobs([job.id], worker="w", lease_s=30)
    store.finish_jobs([JobOutcome(job_id=job.id, result=_result())])
    assert store.claim_jobs([job.id], worker="w", lease_s=30) == []
    with pytest.raises(InvalidState, match="already succeeded"):
        store.cancel_job(job.id)


def test_nul_characters_in_requests_and_results_read_back_exactly(store: JobStore) -> None:
    """Postgres text holds no NUL; the store keeps it anyway (inferq.store.text_codec)."""
    tricky = f"a\x00b{ESCAPE}0{ESCAPE}1"
    spec = replace(_spec(tricky), metadata={f"k\x00{ESCAPE}": tricky})
    [job] = create_jobs(store, [spec], queue="interactive")
    read = store.get_job(job.id)
    assert (read.prompt, read.metadata) == (tricky, {f"k\x00{ESCAPE}": tricky})
    store.claim_jobs([job.id], worker="w", lease_s=30)
    assert store.finish_jobs([JobOutcome(job_id=job.id, result=_result(tricky))]) == [job.id]
    result = store.get_job(job.id).result
    assert result is not None
    assert result.choices[0].text == tricky


def test_listing_pages_newest_first_with_a_status_filter(store: JobStore, clock: Clock) -> None:
    ids = []
    for _ in range(5):
        clock.now += timedelta(seconds=1)
        ids += [j.id for j in create_jobs(store, [_spec()], queue="interactive")]
    store.cancel_job(ids[1])
    first = store.list_jobs(limit=2)
    assert [j.id for j in first.items] == ids[::-1][:2]
    assert first.has_more
    rest = store.list_jobs(limit=10, after=first.items[-1].id)
    assert [j.id for j in rest.items] == ids[::-1][2:]
    assert not rest.has_more
    assert [j.id for j in store.list_jobs(status=JobStatus.CANCELLED).items] == [ids[1]]


def test_an_unreachable_database_raises_store_unavailable() -> None:
    engine = make_database("postgresql+psycopg://postgres@127.0.0.1:1/none", pool_size=1)
    store = JobStore(make_sessions(engine))
    with pytest.raises(StoreUnavailable):
        store.ping()
    # A worker's claims and flushes, which run on the driver's own connection, too.
    with pytest.raises(StoreUnavailable):
        store.claim_jobs(["job_x"], worker="w", lease_s=60)
    with pytest.raises(StoreUnavailable):
        store.finish_jobs([JobOutcome(job_id="job_x", result=_result())])


@pytest.mark.parametrize("hold", [False, True], ids=["pooled", "held"])
def test_a_worker_whose_connections_were_lost_fails_one_claim_then_claims(
    database_url: str, hold: bool
) -> None:
    # As a worker's store: no check of a connection before its use.
    engine = make_database(database_url, pool_size=2, pre_ping=False)
    store = JobStore(make_sessions(engine), keep_connections=hold)
    a, b = create_jobs(store, [_spec(), _spec()], queue="interactive")
    with engine.connect(), engine.connect():
        pass  # two connections in the pool
    store.claim_jobs(["job_x"], worker="w", lease_s=60)  # held, when the store holds them
    killer = make_database(database_url, pool_size=1)
    with killer.connect() as connection:
        connection.exec_driver_sql(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    killer.dispose()

    with pytest.raises(StoreUnavailable):
        store.claim_jobs([a.id], worker="w", lease_s=60)
    # The whole pool was renewed: no second connection of the lost ones is tried.
    assert [j.id for j in store.claim_jobs([a.id], worker="w", lease_s=60)] == [a.id]
    with engine.connect():  # the pool's other connection is a new one too
        pass
    assert store.finish_jobs([JobOutcome(job_id=a.id, result=_result())]) == [a.id]
    assert [j.id for j in store.claim_jobs([b.id], worker="w", lease_s=60)] == [b.id]
    store.let_go()
    engine.dispose()


# A connection's backend and how it plans its prepared statements.
_PLANNING = "SELECT pg_backend_pid(), current_setting('plan_cache_mode')"


def _holding_store(database_url: str, jobs: int) -> tuple[Engine, JobStore, list[Job]]:
    """A store that holds connections, as a worker's, on a pool of two, with `jobs`
    single jobs queued."""
    engine = make_database(database_url, pool_size=2, pre_ping=False)
    store = JobStore(make_sessions(engine), keep_connections=True)
    return engine, store, create_jobs(store, [_spec() for _ in range(jobs)], queue="interactive")


def test_a_held_connection_plans_its_statements_once_and_goes_back_planning_as_before(
    database_url: str,
) -> None:
    engine, store, jobs = _holding_store(database_url, 8)

    def planning() -> tuple[int, str]:
        with store._driver() as driver:
            pid, mode = driver.execute(_PLANNING).fetchone() or (0, "")
            return int(pid), str(mode)

    def in_the_pool() -> set[tuple[int, str]]:
        """Each connection the pool holds (two at most): its backend and how it plans."""
        with engine.connect() as one, engine.connect() as other:
            return {
                (int(pid), str(mode))
                for pid, mode in (c.exec_driver_sql(_PLANNING).one() for c in (one, other))
            }

    # More claims and flushes than psycopg runs before it prepares a statement: each is
    # then planned for any ids, not again for each claim's few.
    for job in jobs:
        store.claim_jobs([job.id], worker="w", lease_s=60)
        assert store.finish_jobs([JobOutcome(job_id=job.id, result=_result())]) == [job.id]
    held, mode = planning()
    assert mode == "force_generic_plan"
    assert all(j.status == JobStatus.SUCCEEDED for j in store.get_jobs([j.id for j in jobs]))

    store.let_go()
    back = in_the_pool()
    assert (held, "auto") in back
    assert {mode for _, mode in back} == {"auto"}

    # One let go inside a transaction (whose rollback would undo the reset) is closed.
    with store._driver() as driver:
        row = driver.execute("SELECT pg_backend_pid()").fetchone()
        driver.execute("BEGIN")
    assert row is not None
    back = in_the_pool()
    assert row[0] not in {pid for pid, _ in back}
    assert {mode for _, mode in back} == {"auto"}
    # A store that does not hold connections leaves the setting alone.
    pooled = JobStore(make_sessions(engine))
    with pooled._driver() as driver:
        row = driver.execute("SELECT current_setting('plan_cache_mode')").fetchone()
    assert row == ("auto",)
    engine.dispose()


def test_a_store_that_holds_connections_keeps_one_a_thread_until_the_thread_ends(
    database_url: str,
) -> None:
    engine, store, jobs = _holding_store(database_url, 3)

    def backend() -> int:
        with store._driver() as driver:
            row = driver.execute("SELECT pg_backend_pid()").fetchone()
            assert row is not None
            return int(row[0])

    store.claim_jobs([jobs[0].id], worker="w", lease_s=60)
    mine = backend()
    assert store.finish_jobs([JobOutcome(job_id=jobs[0].id, result=_result())]) == [jobs[0].id]
    assert backend() == mine  # the same connection for every statement of this thread
    assert engine.pool.checkedout() == 1

    others: list[int] = []

    def claim_in_a_thread() -> None:
        store.claim_jobs([jobs[1].id], worker="w", lease_s=60)
        others.append(backend())

    thread = threading.Thread(target=claim_in_a_thread)
    thread.start()
    thread.join()
    [theirs] = others
    assert theirs != mine  # a connection of its own while it ran
    del thread
    gc.collect()
    assert engine.pool.checkedout() == 1  # back in the pool once its thread ended

    # A statement that fails on a healthy connection leaves it held and usable.
    with pytest.raises(psycopg.errors.UndefinedTable), store._driver() as driver:
        driver.execute("SELECT * FROM no_such_table")
    assert backend() == mine
    assert [j.id for j in store.claim_jobs([jobs[2].id], worker="w", lease_s=60)] == [jobs[2].id]

    # A store that does not hold them returns each to the pool.
    pooled = JobStore(make_sessions(engine))
    pooled.claim_jobs(["job_x"], worker="w", lease_s=60)
    assert engine.pool.checkedout() == 1
    store.let_go()
    assert engine.pool.checkedout() == 0
    engine.dispose()
