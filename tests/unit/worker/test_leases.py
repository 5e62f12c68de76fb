"""The lease keeper: every third of a lease it renews the jobs held and marks those asked
for as published; it reports held jobs no longer this worker's, and rides out a store that
cannot be reached."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from inferq.domain.jobs import JobStatus
from tests.helpers.fakes import MemoryJobStore
from worker.leases import LeaseKeeper

WAIT_S = 10
WORKER = "worker-a"
# A lease this short renews every few milliseconds (the fake store takes any length).
SHORT_LEASE_S = 0.03


class Held:
    """The keeper's holder: the jobs it holds and waits for, and those it was told to
    stop work on."""

    def __init__(self, held: Sequence[str] = (), waiting: Sequence[str] = ()) -> None:
        self.held = list(held)
        self.waiting = list(waiting)
        self.lost: list[list[str]] = []

    def held_ids(self) -> list[str]:
        return list(self.held)

    def asked_ids(self) -> list[str]:
        return list(self.waiting)

    def cancel(self, job_ids: Sequence[str]) -> None:
        self.held = [j for j in self.held if j not in job_ids]
        self.lost.append(list(job_ids))


@pytest.fixture
def store() -> MemoryJobStore:
    store = MemoryJobStore()
    for job_id in ("a", "b", "c", "queued"):
        store.add(job_id)
    store.claim_jobs(["a", "b", "c"], worker=WORKER, lease_s=60)
    return store


def _keeper(store: MemoryJobStore, held: Held, lease_s: float = SHORT_LEASE_S) -> LeaseKeeper:
    return LeaseKeeper(
        store=store,
        worker_name=WORKER,
        lease_s=lease_s,  # type: ignore[arg-type]
        holder=held,
    )


@pytest.fixture
def keep(store: MemoryJobStore) -> Iterator[list[LeaseKeeper]]:
    started: list[LeaseKeeper] = []
    yield started
    for keeper in started:
        keeper.stop()
    assert not [t for t in threading.enumerate() if t.name == "leases"]


def _renewals(store: MemoryJobStore, count: int) -> None:
    assert store.wait_for(lambda: store.calls["renew_leases"] >= count, WAIT_S)


def test_held_jobs_are_renewed_and_waiting_ones_marked_published_again_and_again(
    store: MemoryJobStore, keep: list[LeaseKeeper]
) -> None:
    held = Held(held=["a", "b"], waiting=["queued"])
    keeper = _keeper(store, held)
    keep.append(keeper)
    keeper.start()
    _renewals(store, 3)
    assert set(store.renewed) == {"a", "b"}
    assert store.renewed.count("a") >= 3
    assert store.touched.count("queued") >= 3
    # "c" is held here too but the holder does not list it: its lease is left alone.
    assert "c" not in store.renewed
    assert store.jobs["a"].lease_ends > time.monotonic()
    assert held.lost == []


def test_a_held_job_that_is_no_longer_this_workers_is_reported_lost_once(
    store: MemoryJobStore, keep: list[LeaseKeeper]
) -> None:
    store.cancel("b")
    store.take_over("c", worker="worker-b")
    held = Held(held=["c", "a", "b"])
    keeper = _keeper(store, held)
    keep.append(keeper)
    keeper.start()
    _renewals(store, 3)
    assert held.lost == [["b", "c"]]
    assert store.status("b") is JobStatus.CANCELLED
    assert store.jobs["c"].worker == "worker-b"


def test_a_store_that_cannot_be_reached_loses_no_job_and_renewal_goes_on(
    store: MemoryJobStore, keep: list[LeaseKeeper]
) -> None:
    store.fail("renew_leases", times=2)
    held = Held(held=["a"], waiting=["queued"])
    keeper = _keeper(store, held)
    keep.append(keeper)
    keeper.start()
    _renewals(store, 3)
    assert store.renewed[0] == "a"
    assert held.lost == []


def test_a_failed_mark_of_waiting_jobs_still_renews_the_leases(
    store: MemoryJobStore, keep: list[LeaseKeeper]
) -> None:
    store.fail("touch_published", times=2)
    keeper = _keeper(store, Held(held=["a"], waiting=["queued"]))
    keep.append(keeper)
    keeper.start()
    assert store.wait_for(lambda: store.calls["touch_published"] >= 3, WAIT_S)
    # The two rounds whose mark failed renewed "a" all the same.
    assert store.renewed.count("a") >= 2


def test_no_renewal_before_a_third_of_the_lease_and_stop_ends_the_wait_at_once(
    store: MemoryJobStore,
) -> None:
    keeper = _keeper(store, Held(held=["a"]), lease_s=3600)
    keeper.start()
    started = time.monotonic()
    keeper.stop()
    assert time.monotonic() - started < WAIT_S / 2
    assert store.calls["renew_leases"] == 0
    assert not [t for t in threading.enumerate() if t.name == "leases"]
