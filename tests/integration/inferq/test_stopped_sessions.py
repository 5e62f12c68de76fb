"""A process stopped inside a transaction (SIGSTOP, a paused VM) does not hold the rows it
locked from everyone else: Postgres ends its session, and it writes again once it wakes. A
long read for a slow client is not ended so."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from inferq.domain.jobs import JobStatus
from inferq.exceptions import StoreUnavailable
from inferq.store.base import Store, _translated
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore
from tests.helpers.clock import Clock
from tests.helpers.jobs import create_jobs
from tests.integration.inferq.test_store import _spec


def test_a_cancel_goes_through_a_lock_held_by_a_stopped_session(
    database_url: str, clock: Clock
) -> None:
    stalled = make_database(database_url, pool_size=1, idle_in_transaction_s=1)
    other = make_database(database_url, pool_size=1)
    store = JobStore(make_sessions(other), clock=clock)
    [job] = create_jobs(store, [_spec()], queue="interactive")
    try:
        # A worker's write, stopped between its statements with the job's row locked.
        held = stalled.connect()
        held.begin()
        held.execute(text("SELECT id FROM jobs WHERE id = :id FOR UPDATE"), {"id": job.id})

        cancelled: list[JobStatus] = []
        cancel = threading.Thread(
            target=lambda: cancelled.append(store.cancel_job(job.id).status), daemon=True
        )
        cancel.start()
        cancel.join(60)
        assert cancelled == [JobStatus.CANCELLED]

        # Woken, the stalled writer finds its session gone: the error the workers
        # already handle as a lost database, and nothing it had not committed is kept.
        with pytest.raises(StoreUnavailable), _translated():
            held.execute(text("SELECT 1"))
        assert store.get_job(job.id).status is JobStatus.CANCELLED
    finally:
        stalled.dispose()
        other.dispose()


class _Reader(Store):
    def numbers(self, count: int) -> Iterator[int]:
        """What the batch downloads do: a read through a server-side cursor, a row a fetch."""
        query = text(f"SELECT generate_series(1, {count})").execution_options(yield_per=1)
        with self._reading() as session:
            for row in session.execute(query):
                yield row[0]


def test_a_read_for_a_slow_client_is_not_ended_as_idle(database_url: str) -> None:
    engine = make_database(database_url, pool_size=1, idle_in_transaction_s=1)
    try:
        read = _Reader(make_sessions(engine)).numbers(3)
        first = next(read)
        time.sleep(2.5)  # the client: slower than the idle limit between two fetches
        assert [first, *read] == [1, 2, 3]
    finally:
        engine.dispose()
