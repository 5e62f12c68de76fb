"""What a GPU worker's heartbeat says of it: whether it has room for another message and
whether it is stuck, read from its gpu_worker and its probes' state."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from inferq.broker.worker_registry import WorkerRegistry, WorkerStatus
from inferq.store.engine_speeds import SpeedStore
from tests.helpers.fakes import HeldEngine, MemoryJobStore, StepEngine
from tests.helpers.waiting import wait_until
from worker.gpu_worker import GpuWorker
from worker.heartbeat import Heartbeat
from worker.metrics import WorkerMetrics
from worker.probes import State

WAIT_S = 10
STUCK = "3 waiting, room to take them, and nothing taken for 121 s"


class Beats(WorkerRegistry):
    """The registry's calls, kept rather than sent to Redis."""

    def __init__(self) -> None:
        self.statuses: list[WorkerStatus] = []

    def beat(self, status: WorkerStatus) -> None:
        self.statuses.append(status)

    def leave(self, name: str) -> None:
        pass

    def online(self) -> list[WorkerStatus]:
        """The latest status of each worker that beat."""
        return list({status.name: status for status in self.statuses}.values())


class NoSpeeds(SpeedStore):
    def __init__(self) -> None:
        pass

    def report(self, **_: object) -> None:
        pass


class Watch:
    stuck: str | None = None


class Announced:
    def finished(self, job_ids: object, *, batch_ids: object = (), results: object = None) -> None:
        pass


@pytest.fixture
def store() -> MemoryJobStore:
    return MemoryJobStore()


@pytest.fixture
def engine() -> HeldEngine:
    return HeldEngine()


@pytest.fixture
def gpu_worker(store: MemoryJobStore, engine: HeldEngine) -> Iterator[GpuWorker]:
    fatal: list[BaseException] = []
    made = GpuWorker(
        store=store,
        engine=engine,
        engine_factory=StepEngine,
        events=Announced(),
        worker_name="gpu-1@test",
        max_num_seqs=8,
        interactive_seqs=0,
        max_batch_size=8,
        max_batch_delay_ms=0,
        max_held_jobs=16,
        single_extra_held=0,
        result_flush_ms=1,
        lease_s=3600,
        requeue_after_s=0,
        max_engine_deaths=3,
        on_fatal=fatal.append,
        metrics=WorkerMetrics(CollectorRegistry()),
    )
    made.start()
    yield made
    engine.go.set()
    made.stop()
    assert fatal == []


def beat(
    gpu_worker: GpuWorker, state: State, *, slots: int, registry: Beats | None = None
) -> WorkerStatus:
    """The status one heartbeat sends."""
    registry = registry or Beats()
    heartbeat = Heartbeat(
        registry,
        gpu_worker=gpu_worker,
        model="m",
        runner="generate",
        adapters=[],
        gpus=[],
        speeds=NoSpeeds(),
        state=state,
        slots=slots,
    )
    heartbeat.start()  # the first beat is sent before start returns
    heartbeat.stop()
    return registry.statuses[-1]


def test_the_heartbeat_says_whether_the_worker_has_room_and_why_it_is_stuck(
    gpu_worker: GpuWorker, store: MemoryJobStore, engine: HeldEngine
) -> None:
    state = State()
    # Loading: a free thread takes nothing until the worker consumes.
    assert beat(gpu_worker, state, slots=1).room is False
    state.ready = True
    status = beat(gpu_worker, state, slots=1)
    assert (status.room, status.stuck) == (True, None)

    watch = Watch()
    state.watch = watch  # type: ignore[assignment]
    watch.stuck = STUCK
    status = beat(gpu_worker, state, slots=1)
    assert (status.room, status.stuck) == (True, STUCK)

    # Its one slot holds a message whose job runs: no room, however idle the door.
    watch.stuck = None
    store.add("a")
    ended = threading.Event()
    gpu_worker.take(["a"])(lambda _returned: ended.set())
    try:
        wait_until(lambda: engine.admitted == ["a"], timeout_s=WAIT_S, what="in the engine")
        assert beat(gpu_worker, state, slots=1).room is False
        assert beat(gpu_worker, state, slots=2).room is True
    finally:
        engine.go.set()
        assert ended.wait(WAIT_S)
    assert beat(gpu_worker, state, slots=1).room is True


def test_a_heartbeat_from_an_earlier_release_still_reads() -> None:
    earlier = {
        "name": "gpu-1@test",
        "model": "m",
        "started_at": "2026-11-26T00:00:00+00:00",
        "jobs_held": 0,
        "sequences_in_flight": 0,
        "engine_restarts": 0,
        "jobs_last_minute": 0,
        "prompt_tokens_last_minute": 0,
        "generated_tokens_last_minute": 0,
    }
    status = WorkerStatus(**earlier)
    assert (status.room, status.stuck) == (False, None)


class Speeds(SpeedStore):
    """The speed reports, kept with when they came."""

    def __init__(self) -> None:
        self.reports: list[float] = []

    def report(self, **_: object) -> None:
        self.reports.append(time.monotonic())


def test_a_busy_engine_with_no_rate_yet_is_reported_every_second(
    gpu_worker: GpuWorker, store: MemoryJobStore, engine: HeldEngine
) -> None:
    """A fresh deployment's first batch has no estimate until a rate measured at load is
    in Postgres: a busy worker that has none reports every second, not every 5 s; an idle
    one does not."""
    speeds = Speeds()
    heartbeat = Heartbeat(
        Beats(),
        gpu_worker=gpu_worker,
        model="m",
        runner="generate",
        adapters=[],
        gpus=[],
        speeds=speeds,
        state=State(),
        slots=1,
    )
    heartbeat.start()
    try:
        idle_until = time.monotonic() + 2.5
        wait_until(lambda: time.monotonic() > idle_until, timeout_s=WAIT_S, what="idle")
        assert len(speeds.reports) == 1  # the first beat's, at start
        store.add("a")
        gpu_worker.take(["a"])(lambda _returned: None)
        wait_until(lambda: engine.admitted == ["a"], timeout_s=WAIT_S, what="in the engine")
        busy_at = time.monotonic()
        wait_until(lambda: len(speeds.reports) >= 3, timeout_s=WAIT_S, what="two reports")
        assert speeds.reports[2] - busy_at < 3.5  # two more within about 2 s, not 5
    finally:
        engine.go.set()
        heartbeat.stop()


def test_the_heartbeat_counts_the_workers_that_share_the_models_batch_lines(
    gpu_worker: GpuWorker,
) -> None:
    registry = Beats()
    other = beat(gpu_worker, State(), slots=1, registry=registry)
    for name, model, runner in (("gpu-2@a", "m", "generate"), ("gpu-3@b", "m", "generate")):
        registry.beat(dataclasses.replace(other, name=name, model=model, runner=runner))
    # Another model's worker and an embedding worker of the same model share nothing.
    registry.beat(dataclasses.replace(other, name="gpu-4@c", model="other"))
    registry.beat(dataclasses.replace(other, name="gpu-5@d", runner="pooling"))
    assert gpu_worker.peers == 1
    beat(gpu_worker, State(), slots=1, registry=registry)
    assert gpu_worker.peers == 3
