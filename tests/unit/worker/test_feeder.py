"""The feeder: what it claims, for whom and in what order, and how it rides out a store
that fails (against the in-memory store, so no database is needed)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from inferq.domain.jobs import ClaimedJob, JobStatus
from inferq.exceptions import StoreUnavailable
from tests.helpers.fakes import MemoryJobStore
from worker import feeder as feeder_module
from worker.door import Door
from worker.feeder import Feeder

WAIT_S = 10
WORKER = "worker-a"


class Claims:
    """What the feeder handed to the admission queue, in order: (ids, single jobs?)."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], bool]] = []
        self.changed = threading.Condition()

    def admit(self, jobs: Sequence[ClaimedJob], *, single: bool) -> None:
        with self.changed:
            self.calls.append(([job.id for job in jobs], single))
            self.changed.notify_all()

    def wait_for_ids(self, count: int) -> list[str]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.ids()) >= count, WAIT_S), self.calls
            return self.ids()

    def ids(self) -> list[str]:
        return [job_id for ids, _ in self.calls for job_id in ids]


def _feeder(
    store: MemoryJobStore,
    door: Door,
    claims: Claims,
    *,
    micro_batch: int = 2,
    batch_queue: str | None = "bulk",
    peers: int = 1,
) -> Feeder:
    return Feeder(
        store=store,
        door=door,
        batch_queue=batch_queue,
        worker_name=WORKER,
        lease_s=60,
        micro_batch=micro_batch,
        admits=claims,
        peers=lambda: peers,
        poll_s=WAIT_S,
    )


@pytest.fixture
def store() -> MemoryJobStore:
    return MemoryJobStore()


@pytest.fixture
def running() -> Iterator[list[Feeder]]:
    """Feeders a test started; each is stopped after it, and its thread must end."""
    started: list[Feeder] = []
    yield started
    for feeder in started:
        feeder.stop()
    assert not [t for t in threading.enumerate() if t.name == "feeder"]


def _lines(store: MemoryJobStore, count: int) -> list[str]:
    ids = [f"line-{i}" for i in range(count)]
    for job_id in ids:
        store.add(job_id, batch_id="batch")
    return ids


def test_single_jobs_that_fit_are_claimed_by_the_asker_and_handed_on(
    store: MemoryJobStore,
) -> None:
    store.add("a")
    store.add("b")
    door, claims = Door(1), Claims()
    feeder = _feeder(store, door, claims)
    [ticket_a] = door.ask(["a"])
    [ticket_b] = door.ask(["b"])
    feeder.claim_asked()  # not started: the calling thread claims
    assert claims.calls == [(["a"], True)]
    assert store.jobs["a"].status is JobStatus.RUNNING
    assert store.jobs["a"].worker == WORKER
    # "b" did not fit beside "a": it waits, still queued, for room.
    assert door.held_ids() == ["a"]
    assert door.asked_ids() == ["b"]
    assert store.status("b") is JobStatus.QUEUED
    assert not ticket_a.ended
    assert not ticket_b.ended


def test_a_job_asked_for_and_not_claimed_ends_its_ticket(store: MemoryJobStore) -> None:
    store.add("a")
    store.take_over("a", worker="worker-b")
    door, claims = Door(4), Claims()
    [ticket] = door.ask(["a"])
    _feeder(store, door, claims).claim_asked()
    assert claims.calls == []
    assert ticket.ended
    assert not ticket.returned
    assert door.held_ids() == []


def test_a_claim_that_fails_in_the_askers_thread_is_put_back_for_the_feeder(
    store: MemoryJobStore, running: list[Feeder]
) -> None:
    store.add("a")
    store.fail("claim_jobs")
    door, claims = Door(4), Claims()
    feeder = _feeder(store, door, claims, batch_queue=None)
    door.ask(["a"])
    feeder.claim_asked()
    assert claims.calls == []
    assert door.asked_ids() == ["a"]
    running.append(feeder)
    feeder.start()
    assert claims.wait_for_ids(1) == ["a"]
    assert claims.calls == [(["a"], True)]


def test_an_idle_engine_gets_a_micro_batch_first_then_the_rest_of_the_room(
    store: MemoryJobStore, running: list[Feeder]
) -> None:
    lines = _lines(store, 20)
    door, claims = Door(10), Claims()
    feeder = _feeder(store, door, claims, micro_batch=4, peers=3)
    running.append(feeder)
    feeder.start()
    assert claims.wait_for_ids(10) == lines[:10]
    assert claims.calls == [(lines[:4], False), (lines[4:10], False)]
    assert sorted(door.held_ids()) == sorted(lines[:10])
    assert all(store.status(j) is JobStatus.QUEUED for j in lines[10:])
    # Each claim told the store how many workers share the queue and what this one holds.
    assert [(f.workers, f.held) for f in store.fleets[:2]] == [(3, {}), (3, {"batch": 4})]


def test_a_claim_of_lines_waits_for_room_for_a_whole_micro_batch(
    store: MemoryJobStore, running: list[Feeder]
) -> None:
    # Fewer, larger claims: room freed a few lines at a time is claimed a micro-batch at a
    # time, not as it comes.
    lines = _lines(store, 20)
    door, claims = Door(10), Claims()
    feeder = _feeder(store, door, claims, micro_batch=4)
    running.append(feeder)
    feeder.start()
    claims.wait_for_ids(10)
    door.let_go(lines[:3])
    door.wake()  # it looks now, with room for three lines: not a claim yet
    door.let_go(lines[3:4])
    assert claims.wait_for_ids(14)[10:] == lines[10:14]
    assert claims.calls[2] == (lines[10:14], False)


def test_single_jobs_asked_for_are_claimed_before_batch_lines(
    store: MemoryJobStore, running: list[Feeder]
) -> None:
    lines = _lines(store, 4)
    store.add("a")
    door, claims = Door(2), Claims()
    door.ask(["a"])
    # Room for a micro-batch of one line beside the single job.
    feeder = _feeder(store, door, claims, micro_batch=1)
    running.append(feeder)
    feeder.start()
    claims.wait_for_ids(2)
    assert claims.calls == [(["a"], True), ([lines[0]], False)]


def test_lines_announced_are_looked_for_at_once_not_at_the_next_poll(
    store: MemoryJobStore, running: list[Feeder]
) -> None:
    door, claims = Door(4), Claims()
    feeder = _feeder(store, door, claims)
    running.append(feeder)
    feeder.start()
    # Its first look found nothing; it waits out its poll (WAIT_S) unless woken.
    assert store.wait_for(lambda: len(store.fleets) == 1)
    lines = _lines(store, 2)
    door.wake()
    assert claims.wait_for_ids(2) == lines


def test_a_failed_claim_of_lines_gives_its_room_back_and_is_tried_again(
    store: MemoryJobStore, running: list[Feeder]
) -> None:
    lines = _lines(store, 3)
    store.fail("claim_batch_lines", times=2)
    door, claims = Door(3), Claims()
    feeder = _feeder(store, door, claims, micro_batch=3)
    running.append(feeder)
    feeder.start()
    assert claims.wait_for_ids(3) == lines
    assert store.calls["claim_batch_lines"] == 3
    assert len(door) == 3


def test_a_feeder_gives_up_after_unexpected_errors_in_a_row(
    store: MemoryJobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its thread raises, which ends the process (inferq/host/supervision.py); run here
    in the test's thread, it raises to the test."""
    monkeypatch.setattr(feeder_module, "MAX_BACKOFF_S", 0.001)
    _lines(store, 1)
    store.fail("claim_batch_lines", times=feeder_module.MAX_FAILED_CLAIMS, error=RuntimeError)
    door, claims = Door(2), Claims()
    feeder = _feeder(store, door, claims)
    with pytest.raises(RuntimeError):
        feeder._run()
    assert store.calls["claim_batch_lines"] == feeder_module.MAX_FAILED_CLAIMS
    assert claims.calls == []
    # The room reserved for the claim came back.
    assert door.reserve(2) == 2


def test_a_store_that_cannot_be_reached_is_waited_out_however_long(
    store: MemoryJobStore, running: list[Feeder], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(feeder_module, "MAX_BACKOFF_S", 0.001)
    lines = _lines(store, 1)
    failures = feeder_module.MAX_FAILED_CLAIMS * 2
    store.fail("claim_batch_lines", times=failures, error=StoreUnavailable)
    door, claims = Door(2), Claims()
    feeder = _feeder(store, door, claims)
    running.append(feeder)
    feeder.start()
    assert claims.wait_for_ids(1) == lines
    assert store.calls["claim_batch_lines"] == failures + 1


def test_stop_ends_a_waiting_feeder_at_once(store: MemoryJobStore) -> None:
    door, claims = Door(2), Claims()
    feeder = _feeder(store, door, claims)
    feeder.start()
    assert store.wait_for(lambda: len(store.fleets) == 1)
    started = time.monotonic()
    feeder.stop()
    assert time.monotonic() - started < WAIT_S / 2
    assert not [t for t in threading.enumerate() if t.name == "feeder"]
