"""`GpuWorker` on an in-memory store and a fake engine: what a task relies on when it
hands its jobs over (claimed, run and written before it returns; never run twice; stopped
when cancelled; given back on shutdown), the leases behind it, and the feeder that brings
batch lines in."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime

import pytest
from prometheus_client import CollectorRegistry

from inferq.broker.events import EndAnnounced, end_announced
from inferq.domain.fair_share import ALONE, FleetShare
from inferq.domain.jobs import (
    ClaimedJob,
    JobOutcome,
    JobResult,
    JobStatus,
    SamplingParams,
    ServiceTier,
    engine_priority,
)
from inferq.exceptions import JobsReturned
from tests.helpers.fakes import HeldEngine, MemoryJobStore, StepEngine
from worker.engine.protocol import EngineRequest
from worker.gpu_worker import Batches, GpuWorker, _engine_request
from worker.metrics import WorkerMetrics

ME = "gpu-1@test"
QUEUE = "bulk:test"
WAIT_S = 10


class _Announced:
    """Who hears of committed jobs (long-polls, in a deployment)."""

    def __init__(self) -> None:
        self.job_ids: list[str] = []
        self.batch_ids: list[str] = []
        self.results: dict[str, bytes] = {}

    def finished(
        self,
        job_ids: Sequence[str],
        *,
        batch_ids: Sequence[str] = (),
        results: Mapping[str, bytes] | None = None,
    ) -> None:
        self.job_ids.extend(job_ids)
        self.batch_ids.extend(batch_ids)
        self.results.update(results or {})


class Task:
    """A message's jobs asked for as its Celery task asks (`gpu_worker.ask`, returning at
    once), and what the pool hears when they have ended."""

    def __init__(self, gpu_worker: GpuWorker, job_ids: list[str]) -> None:
        self.returned: JobsReturned | None = None
        self._ended = threading.Event()
        try:
            then = gpu_worker.take(job_ids)
        except JobsReturned as exc:
            self.returned = exc
            self._ended.set()
            return
        then(self._on_end)

    def _on_end(self, returned: bool) -> None:
        if returned:
            self.returned = JobsReturned("its jobs went back to the queue")
        self._ended.set()

    def result(self) -> JobsReturned | None:
        """Wait for the jobs to end: None if they ended normally (the message would be
        acknowledged), a `JobsReturned` if they went back (it would be put back)."""
        assert self._ended.wait(WAIT_S), "the jobs did not end"
        return self.returned


def wait_until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


MakeRuntime = Callable[..., GpuWorker]


@pytest.fixture
def make_runtime() -> Iterator[MakeRuntime]:
    made: list[GpuWorker] = []
    fatal: list[BaseException] = []

    def make(
        *,
        store: MemoryJobStore,
        engine: StepEngine,
        max_num_seqs: int = 8,
        interactive_seqs: int = 0,
        max_held_jobs: int = 16,
        single_extra_held: int = 0,
        lease_s: int = 3600,
        events: _Announced | None = None,
        batches: Batches | None = None,
        batch_queue: str | None = None,
    ) -> GpuWorker:
        gpu_worker = GpuWorker(
            store=store,
            engine=engine,
            engine_factory=StepEngine,
            events=events or _Announced(),
            worker_name=ME,
            max_num_seqs=max_num_seqs,
            interactive_seqs=interactive_seqs,
            max_batch_size=8,
            max_batch_delay_ms=0,
            max_held_jobs=max_held_jobs,
            single_extra_held=single_extra_held,
            result_flush_ms=1,
            lease_s=lease_s,
            requeue_after_s=0,
            max_engine_deaths=3,
            on_fatal=fatal.append,
            metrics=WorkerMetrics(CollectorRegistry()),
            batches=batches,
            batch_queue=batch_queue,
        )
        gpu_worker.start()
        made.append(gpu_worker)
        return gpu_worker

    yield make
    for gpu_worker in made:
        gpu_worker.stop()
    assert fatal == []


def test_a_task_returns_once_the_outcomes_of_its_jobs_are_written(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    for job_id in ("a", "b", "c"):
        store.add(job_id, max_tokens=2)
    engine = StepEngine()
    events = _Announced()
    gpu_worker = make_runtime(store=store, engine=engine, events=events)

    assert Task(gpu_worker, ["a", "b", "c"]).result() is None

    # Checked at once: the task must not return before the commit.
    for job_id in ("a", "b", "c"):
        outcome = store.jobs[job_id].outcome
        assert outcome is not None
        assert outcome.result is not None
        assert outcome.result.choices[0].text == f"done {job_id}"
        assert store.status(job_id) is JobStatus.SUCCEEDED
    assert sorted(events.job_ids) == ["a", "b", "c"]
    # Each announced as committed: whoever waits need not read it.
    for job_id in ("a", "b", "c"):
        stored = store.jobs[job_id]
        outcome = stored.outcome
        assert outcome is not None
        assert outcome.result is not None
        assert end_announced(events.results[job_id]) == EndAnnounced(
            choices=outcome.result.choices,
            started_at=outcome.started_at,
            finished_at=stored.finished_at,
            attempts=1,
        )
    assert gpu_worker.held == 0
    assert engine.requests["a"].priority == engine_priority(0, single=True)
    minute = gpu_worker.last_minute.total()
    assert (minute.jobs, minute.prompt_tokens, minute.generated_tokens) == (3, 9, 6)


def test_a_task_claims_its_job_as_it_asks_and_the_feeder_one_that_waits_for_room(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("a")
    store.add("b")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine, max_num_seqs=1, max_held_jobs=1)

    first = Task(gpu_worker, ["a"])
    # Claimed before its task returned: no other thread had to be woken for it.
    assert store.status("a") is JobStatus.RUNNING
    second = Task(gpu_worker, ["b"])
    assert store.status("b") is JobStatus.QUEUED  # no room: it waits, still queued
    engine.go.set()

    assert first.result() is None
    assert second.result() is None
    assert store.status("b") is JobStatus.SUCCEEDED
    assert store.jobs["b"].claims == 1


def test_jobs_held_elsewhere_or_already_finished_are_not_run(make_runtime: MakeRuntime) -> None:
    store = MemoryJobStore()
    for job_id in ("theirs", "mine", "finished"):
        store.add(job_id)
    store.take_over("theirs", worker="gpu-2@test")
    store.finish_jobs(
        [JobOutcome(job_id="finished", result=JobResult(choices=(), prompt_tokens=1))]
    )
    engine = StepEngine()
    gpu_worker = make_runtime(store=store, engine=engine)

    # A redelivered message: acknowledged without running what is not this worker's.
    assert Task(gpu_worker, ["theirs", "mine", "finished"]).result() is None

    assert engine.admitted == ["mine"]
    assert store.jobs["theirs"].worker == "gpu-2@test"
    assert store.jobs["theirs"].outcome is None
    assert store.status("mine") is JobStatus.SUCCEEDED


def test_a_job_in_two_messages_runs_once(make_runtime: MakeRuntime) -> None:
    store = MemoryJobStore()
    store.add("a")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine)
    first = Task(gpu_worker, ["a"])
    assert wait_until(lambda: "a" in engine.admitted)

    second = Task(gpu_worker, ["a"])
    engine.go.set()

    assert first.result() is None
    assert second.result() is None
    assert engine.admitted == ["a"]
    assert store.jobs["a"].claims == 1
    assert store.status("a") is JobStatus.SUCCEEDED


def test_a_cancelled_job_is_aborted_in_the_engine_and_its_task_returns(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("cancelled")
    store.add("other")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine)
    task = Task(gpu_worker, ["cancelled", "other"])
    assert wait_until(lambda: len(engine.admitted) == 2)

    store.cancel("cancelled")
    gpu_worker.cancel(["cancelled", "not-held-here"])
    assert wait_until(lambda: engine.aborted == ["cancelled"])
    engine.go.set()

    assert task.result() is None
    assert store.status("cancelled") is JobStatus.CANCELLED
    assert store.jobs["cancelled"].outcome is None
    assert store.status("other") is JobStatus.SUCCEEDED
    assert gpu_worker.held == 0


def test_a_job_cancelled_as_its_claim_commits_never_enters_the_engine(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("raced")
    store.add("other")
    engine = StepEngine()
    gpu_workers: list[GpuWorker] = []
    claim = store.claim_jobs

    def claim_then_hear_a_cancel(
        job_ids: Sequence[str], *, worker: str, lease_s: int
    ) -> list[ClaimedJob]:
        claimed = claim(job_ids, worker=worker, lease_s=lease_s)
        # The cancel commits right after the claim, and the worker hears of it before
        # the claim has returned (so before the job has a ticket here).
        store.cancel("raced")
        gpu_workers[0].cancel(["raced"])
        return claimed

    store.claim_jobs = claim_then_hear_a_cancel  # type: ignore[method-assign]
    gpu_workers.append(make_runtime(store=store, engine=engine))

    assert Task(gpu_workers[0], ["raced", "other"]).result() is None
    assert "raced" not in engine.requests
    assert store.status("raced") is JobStatus.CANCELLED
    assert store.status("other") is JobStatus.SUCCEEDED
    assert gpu_workers[0].held == 0


def test_a_drain_gives_back_jobs_not_yet_in_the_engine_and_lets_running_ones_finish(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("running")
    store.add("pending")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine, max_num_seqs=1)
    task = Task(gpu_worker, ["running", "pending"])
    assert wait_until(lambda: engine.admitted == ["running"] and len(gpu_worker.admission) == 1)

    drain = threading.Thread(target=gpu_worker.drain, args=(WAIT_S,), daemon=True)
    drain.start()
    # At once, before the job in the engine finishes.
    assert store.wait_for(lambda: store.jobs["pending"].status is JobStatus.QUEUED)
    engine.go.set()
    drain.join(WAIT_S)
    assert not drain.is_alive()

    assert isinstance(task.result(), JobsReturned)
    assert store.wait_for(lambda: store.jobs["running"].status is JobStatus.SUCCEEDED)
    assert store.jobs["pending"].worker is None
    assert engine.admitted == ["running"]
    with pytest.raises(JobsReturned):
        gpu_worker.take(["late"])


class _SlowToAdd(StepEngine):
    """A StepEngine that blocks in `add` for one job until `go` is set."""

    def __init__(self, slow: str) -> None:
        super().__init__()
        self.slow = slow
        self.adding = threading.Event()
        self.go = threading.Event()

    def add(self, request: EngineRequest) -> None:
        if request.job_id == self.slow:
            self.adding.set()
            self.go.wait(WAIT_S)
        super().add(request)


def test_a_drain_lets_jobs_entering_the_engine_or_being_written_finish(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("written", max_tokens=1)
    store.add("entering")
    store.add("pending")
    engine = _SlowToAdd("entering")
    writing, write = threading.Event(), threading.Event()
    finish, release = store.finish_jobs, store.give_back_jobs

    def slow_finish(outcomes: Sequence[JobOutcome], *, now: datetime | None = None) -> list[str]:
        if any(o.job_id == "written" for o in outcomes):
            writing.set()
            write.wait(WAIT_S)
        return finish(outcomes, now=now)

    def release_then_go_on(
        job_ids: Sequence[str], *, worker: str, requeue_after_s: int
    ) -> list[str]:
        released = release(job_ids, worker=worker, requeue_after_s=requeue_after_s)
        # The drain has given back what waited for the engine: now the job being added
        # and the result being written may go on.
        engine.go.set()
        write.set()
        return released

    store.finish_jobs = slow_finish  # type: ignore[method-assign]
    store.give_back_jobs = release_then_go_on  # type: ignore[method-assign]
    gpu_worker = make_runtime(store=store, engine=engine, max_num_seqs=1)
    written = Task(gpu_worker, ["written"])
    assert writing.wait(WAIT_S)
    both = Task(gpu_worker, ["entering", "pending"])
    assert engine.adding.wait(WAIT_S)
    assert wait_until(lambda: len(gpu_worker.admission) == 1)

    drain = threading.Thread(target=gpu_worker.drain, args=(WAIT_S,), daemon=True)
    drain.start()
    drain.join(WAIT_S)
    assert not drain.is_alive()

    # The result being written was kept, and its message will be acknowledged ...
    assert written.result() is None
    assert store.status("written") is JobStatus.SUCCEEDED
    # ... the job on its way into the engine ran to its end, once ...
    assert store.status("entering") is JobStatus.SUCCEEDED
    assert engine.aborted == []
    assert store.jobs["entering"].claims == 1
    # ... and only the job that waited for the engine went back.
    assert isinstance(both.result(), JobsReturned)
    assert store.status("pending") is JobStatus.QUEUED
    assert gpu_worker.held == 0


def test_a_drain_that_times_out_aborts_what_is_left_and_gives_it_back(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("running")
    store.add("waiting")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine, max_held_jobs=1)
    running = Task(gpu_worker, ["running"])
    assert wait_until(lambda: engine.admitted == ["running"])
    # Its task waits at the door (or has not reached it yet: the drain turns it away
    # either way).
    waiting = Task(gpu_worker, ["waiting"])
    # The first give-back fails: the GpuWorker tries again.
    store.fail("give_back_jobs")

    gpu_worker.drain(timeout_s=0)

    assert isinstance(running.result(), JobsReturned)
    assert isinstance(waiting.result(), JobsReturned)
    assert wait_until(lambda: engine.aborted == ["running"])
    assert store.status("running") is JobStatus.QUEUED
    assert store.jobs["waiting"].claims == 0
    assert store.status("waiting") is JobStatus.QUEUED


def test_leases_of_held_jobs_are_renewed_and_waiting_messages_marked_alive(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("held")
    store.add("waiting")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine, max_held_jobs=1, lease_s=1)
    held = Task(gpu_worker, ["held"])
    assert wait_until(lambda: engine.admitted == ["held"])
    claimed_until = store.jobs["held"].lease_ends
    waiting = Task(gpu_worker, ["waiting"])

    assert store.wait_for(lambda: store.jobs["held"].lease_ends > claimed_until)
    assert store.wait_for(lambda: "waiting" in store.touched)
    assert "held" not in store.touched
    assert store.status("waiting") is JobStatus.QUEUED
    engine.go.set()

    assert held.result() is None
    assert waiting.result() is None
    assert store.status("waiting") is JobStatus.SUCCEEDED


def test_a_job_another_worker_took_over_is_dropped_when_its_lease_is_renewed(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("a")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine, lease_s=1)
    task = Task(gpu_worker, ["a"])
    assert wait_until(lambda: engine.admitted == ["a"])

    store.take_over("a", worker="gpu-2@test")

    assert wait_until(lambda: engine.aborted == ["a"])
    assert task.result() is None
    assert store.jobs["a"].worker == "gpu-2@test"
    assert store.jobs["a"].outcome is None


def test_a_claim_rides_out_a_store_outage(make_runtime: MakeRuntime) -> None:
    store = MemoryJobStore()
    store.add("a")
    store.fail("claim_jobs", times=2)
    gpu_worker = make_runtime(store=store, engine=StepEngine())

    assert Task(gpu_worker, ["a"]).result() is None
    assert store.status("a") is JobStatus.SUCCEEDED


def test_the_feeder_brings_batch_lines_in_and_nobody_waits_on_them(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    lines = [f"line-{i}" for i in range(20)]
    for job_id in lines:
        store.add(job_id, batch_id="batch", priority=5)
    events = _Announced()
    gpu_worker = make_runtime(
        store=store, engine=(engine := StepEngine()), events=events, batch_queue=QUEUE
    )

    assert store.wait_for(lambda: all(store.status(j) is JobStatus.SUCCEEDED for j in lines))
    assert wait_until(lambda: gpu_worker.held == 0)
    # A line's end is announced on its batch's channel, where a wait on it listens, not
    # on one of its own.
    assert events.job_ids == []
    assert set(events.batch_ids) == {"batch"}
    # In the order they were claimed, and all at one priority: the claim decided.
    assert engine.admitted == lines
    assert {r.priority for r in engine.requests.values()} == {engine_priority(0, single=False)}
    # Lines that come later are found without a wake-up, and sooner with one.
    store.add("late", batch_id="batch")
    gpu_worker.wake_batches()
    assert store.wait_for(lambda: store.status("late") is JobStatus.SUCCEEDED)


def test_a_single_job_gets_in_while_batch_lines_fill_the_worker(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    for job_id in ("line-1", "line-2", "line-3"):
        store.add(job_id, batch_id="batch")
    store.add("single")
    engine = HeldEngine()
    gpu_worker = make_runtime(
        store=store,
        engine=engine,
        max_num_seqs=1,
        interactive_seqs=1,
        max_held_jobs=2,
        single_extra_held=1,
        batch_queue=QUEUE,
    )
    assert wait_until(lambda: engine.admitted == ["line-1"] and gpu_worker.held == 2)

    single = Task(gpu_worker, ["single"])
    assert wait_until(lambda: engine.admitted == ["line-1", "single"])
    assert store.status("line-3") is JobStatus.QUEUED
    engine.go.set()

    assert single.result() is None
    assert store.wait_for(lambda: store.status("line-3") is JobStatus.SUCCEEDED)
    assert store.status("single") is JobStatus.SUCCEEDED


class _ClaimRaisesOnce(MemoryJobStore):
    def __init__(self) -> None:
        super().__init__()
        self.raised = False

    def claim_batch_lines(
        self,
        *,
        queue: str,
        worker: str,
        lease_s: int,
        limit: int,
        fleet: FleetShare = ALONE,
    ) -> list[ClaimedJob]:
        if not self.raised:
            self.raised = True
            raise RuntimeError("a bug")
        return super().claim_batch_lines(
            queue=queue, worker=worker, lease_s=lease_s, limit=limit, fleet=fleet
        )


def test_the_feeder_rides_out_a_store_outage_or_a_claim_that_raises(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("line", batch_id="batch")
    store.fail("claim_batch_lines", times=2)
    make_runtime(store=store, engine=StepEngine(), batch_queue=QUEUE)
    assert store.wait_for(lambda: store.status("line") is JobStatus.SUCCEEDED)

    # The room its claim took comes back: all of it, or nothing would get in again.
    raising = _ClaimRaisesOnce()
    lines = [f"line-{i}" for i in range(16)]
    for job_id in lines:
        raising.add(job_id, batch_id="batch")
    gpu_worker = make_runtime(store=raising, engine=StepEngine(), batch_queue=QUEUE)
    assert raising.wait_for(lambda: all(raising.status(j) is JobStatus.SUCCEEDED for j in lines))
    assert raising.raised
    assert wait_until(lambda: gpu_worker.held == 0)


def test_a_drain_gives_back_batch_lines_waiting_for_the_engine(make_runtime: MakeRuntime) -> None:
    store = MemoryJobStore()
    for job_id in ("line-1", "line-2", "line-3"):
        store.add(job_id, batch_id="batch")
    engine = HeldEngine()
    gpu_worker = make_runtime(store=store, engine=engine, max_num_seqs=1, batch_queue=QUEUE)
    assert wait_until(lambda: engine.admitted == ["line-1"] and gpu_worker.held == 3)

    drain = threading.Thread(target=gpu_worker.drain, args=(WAIT_S,), daemon=True)
    drain.start()
    assert store.wait_for(
        lambda: all(store.status(j) is JobStatus.QUEUED for j in ("line-2", "line-3"))
    )
    engine.go.set()
    drain.join(WAIT_S)
    assert not drain.is_alive()
    assert store.status("line-1") is JobStatus.SUCCEEDED
    assert engine.admitted == ["line-1"]
    assert gpu_worker.held == 0


class _Checked:
    """The batches the worker was told to look at, call by call."""

    def __init__(self) -> None:
        self.calls: list[set[str]] = []

    def lines_ended(self, batch_ids: set[str]) -> None:
        self.calls.append(batch_ids)


def test_a_batch_is_checked_for_its_end_once_none_of_its_lines_is_held(
    make_runtime: MakeRuntime,
) -> None:
    store = MemoryJobStore()
    store.add("line-1", batch_id="batch", max_tokens=1)
    store.add("line-2", batch_id="batch", max_tokens=3)
    checked = _Checked()
    make_runtime(store=store, engine=StepEngine(), batches=checked, batch_queue=QUEUE)

    # Asked once both are written, on the writer's thread.
    assert wait_until(lambda: checked.calls == [{"batch"}])


def test_batch_work_is_known_as_such_from_its_claim_to_its_write() -> None:
    """A batch line, and a single job of the flex tier, enter the engine behind single jobs
    and come out as batch work (written with batch lines); other single jobs do not."""

    def request(*, single: bool, priority: int = 0) -> EngineRequest:
        job = ClaimedJob(
            id="j",
            model="m",
            prompt_token_ids=[1],
            sampling=SamplingParams(max_tokens=1),
            created_at=datetime.now(UTC),
            priority=priority,
        )
        return _engine_request(job, single=single)

    line = request(single=False)
    flex = request(single=True, priority=ServiceTier.FLEX.priority)
    urgent = request(single=True, priority=ServiceTier.PRIORITY.priority)
    plain = request(single=True)
    assert [r.bulk for r in (line, flex, urgent, plain)] == [True, True, False, False]
    assert urgent.priority < plain.priority < line.priority == flex.priority
