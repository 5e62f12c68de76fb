"""Fakes with the real interfaces, for unit tests: engines (`worker.engine.protocol.Engine`), an
in-memory job store (`worker.store.WorkerStore`), Redis pub/sub (`MemoryPubSub`) and a token
stream writer (`KeptTokens`)."""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from redis.exceptions import ConnectionError as RedisConnectionError

from inferq.broker.token_stream import ChoiceDelta, JobDelta, TokenEvent
from inferq.domain.fair_share import ALONE, FleetShare
from inferq.domain.jobs import Choice, ClaimedJob, JobOutcome, JobResult, JobStatus, SamplingParams
from inferq.exceptions import EngineError, RequestRejected, StoreUnavailable
from worker.engine.protocol import EngineRequest, Finished


class StepEngine:
    """Each request finishes after `max_tokens` steps; every step is recorded. A streamed
    request makes one token, "t", a step (its result is all of them)."""

    def __init__(self, *, poison: str | None = None, reject: str | None = None) -> None:
        self.running: dict[str, int] = {}
        self.requests: dict[str, EngineRequest] = {}
        self.batch_sizes: list[int] = []
        self.admitted: list[str] = []
        self.aborted: list[str] = []
        self.closed = False
        self._deltas: list[JobDelta] = []
        self._poison = poison
        self._reject = reject

    def add(self, request: EngineRequest) -> None:
        if request.job_id == self._reject:
            raise RequestRejected("refused by the fake engine")
        self.running[request.job_id] = request.sampling.max_tokens
        self.requests[request.job_id] = request
        self.admitted.append(request.job_id)

    def step(self) -> list[Finished]:
        if self._poison is not None and self._poison in self.running:
            raise EngineError("the fake engine died")
        self.batch_sizes.append(len(self.running))
        done = []
        self._deltas = []
        for job_id in list(self.running):
            self.running[job_id] -= 1
            request = self.requests[job_id]
            left = self.running[job_id]
            if request.stream:
                self._deltas.append(_one_token(request, left))
            if left <= 0:
                del self.running[job_id]
                done.append(
                    Finished(
                        job_id=job_id,
                        result=JobResult(
                            choices=(
                                Choice(
                                    index=0,
                                    text="t" * request.sampling.max_tokens
                                    if request.stream
                                    else f"done {job_id}",
                                    finish_reason="length",
                                    completion_tokens=request.sampling.max_tokens,
                                ),
                            ),
                            prompt_tokens=len(request.prompt_token_ids),
                        ),
                    )
                )
        return done

    def deltas(self) -> list[JobDelta]:
        return self._deltas

    def abort(self, job_ids: Sequence[str]) -> None:
        for job_id in job_ids:
            if self.running.pop(job_id, None) is not None:
                self.aborted.append(job_id)

    def close(self) -> None:
        self.closed = True

    def kv_cache_usage(self) -> float | None:
        return None


class HeldEngine(StepEngine):
    """A StepEngine whose requests make no progress until `go` is set: jobs stay in it for
    as long as a test needs them there."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()

    def step(self) -> list[Finished]:
        # A short wait, not a block: the loop must still see aborts and stops.
        if not self.go.wait(0.01):
            return []
        return super().step()


def _one_token(request: EngineRequest, left: int) -> JobDelta:
    made = request.sampling.max_tokens - left
    return JobDelta(
        job_id=request.job_id,
        choices=(
            ChoiceDelta(
                index=0,
                text="t",
                offset=made - 1,
                tokens=1,
                finish_reason="length" if left <= 0 else None,
            ),
        ),
    )


@dataclass
class StoredJob:
    """A job as the in-memory store keeps it."""

    id: str
    max_tokens: int
    batch_id: str | None
    priority: int
    status: JobStatus = JobStatus.QUEUED
    worker: str | None = None
    lease_ends: float = 0.0  # on the store's clock, in seconds
    outcome: JobOutcome | None = None
    finished_at: datetime | None = None
    claims: int = 0


class MemoryJobStore:
    """The job store's worker calls (`worker.store.WorkerStore`) over a dict, with the same
    rules as the SQL store: a claim takes queued jobs and running ones whose lease ran out;
    results are written only to jobs still queued or running. Thread-safe; `changed` is
    notified after every call, so a test can wait for what it expects.

    `fail(method, times)` makes the next `times` calls of a method raise `StoreUnavailable`
    (or `error`); `calls` counts every call by method, failed ones included, and `fleets`
    records the `FleetShare` of every claim of batch lines that succeeded.
    """

    def __init__(self, *, clock: Callable[[], float] | None = None) -> None:
        self.jobs: dict[str, StoredJob] = {}
        self.touched: list[str] = []
        self.renewed: list[str] = []
        self.fleets: list[FleetShare] = []
        self.calls: Counter[str] = Counter()
        self.changed = threading.Condition()
        self._clock = clock or time.monotonic
        self._failures: dict[str, tuple[int, type[Exception]]] = {}

    def add(
        self,
        job_id: str,
        *,
        max_tokens: int = 2,
        batch_id: str | None = None,
        priority: int = 0,
    ) -> None:
        with self.changed:
            self.jobs[job_id] = StoredJob(job_id, max_tokens, batch_id, priority)

    def take_over(self, job_id: str, *, worker: str, lease_s: float = 3600) -> None:
        """Another worker holds `job_id` now (as after this worker's lease lapsed)."""
        with self.changed:
            job = self.jobs[job_id]
            job.status, job.worker = JobStatus.RUNNING, worker
            job.lease_ends = self._clock() + lease_s

    def cancel(self, job_id: str) -> None:
        with self.changed:
            self.jobs[job_id].status = JobStatus.CANCELLED

    def fail(
        self, method: str, times: int = 1, *, error: type[Exception] = StoreUnavailable
    ) -> None:
        with self.changed:
            self._failures[method] = (times, error)

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)

    def claim_jobs(self, job_ids: Sequence[str], *, worker: str, lease_s: int) -> list[ClaimedJob]:
        with self._call("claim_jobs"):
            now = self._clock()
            claimed = []
            for job in (self.jobs[j] for j in job_ids if j in self.jobs):
                lapsed = job.status is JobStatus.RUNNING and job.lease_ends < now
                if job.status is JobStatus.QUEUED or lapsed:
                    job.status, job.worker = JobStatus.RUNNING, worker
                    job.lease_ends = now + lease_s
                    job.claims += 1
                    claimed.append(_claimed(job))
            return claimed

    def claim_batch_lines(
        self,
        *,
        queue: str,
        worker: str,
        lease_s: int,
        limit: int,
        fleet: FleetShare = ALONE,
    ) -> list[ClaimedJob]:
        """Queued batch lines in the order they were added (the SQL store's order between
        tenants, and its shares between workers, are tested on Postgres)."""
        with self._call("claim_batch_lines"):
            self.fleets.append(fleet)
            waiting = [
                job.id
                for job in self.jobs.values()
                if job.batch_id is not None and job.status is JobStatus.QUEUED
            ]
        return self.claim_jobs(waiting[:limit], worker=worker, lease_s=lease_s)

    def renew_leases(self, job_ids: Sequence[str], *, worker: str, lease_s: int) -> set[str]:
        with self._call("renew_leases"):
            self.renewed.extend(job_ids)
            held = set()
            for job in (self.jobs[j] for j in job_ids if j in self.jobs):
                mine = job.status is JobStatus.RUNNING and job.worker == worker
                if mine or job.status is JobStatus.QUEUED:
                    job.status, job.worker = JobStatus.RUNNING, worker
                    job.lease_ends = self._clock() + lease_s
                    held.add(job.id)
            return set(job_ids) - held

    def touch_published(self, job_ids: Sequence[str]) -> None:
        with self._call("touch_published"):
            self.touched.extend(job_ids)

    def give_back_jobs(
        self, job_ids: Sequence[str], *, worker: str, requeue_after_s: int
    ) -> list[str]:
        with self._call("give_back_jobs"):
            released = []
            for job in (self.jobs[j] for j in job_ids if j in self.jobs):
                if job.status is JobStatus.RUNNING and job.worker == worker:
                    job.status, job.worker = JobStatus.QUEUED, None
                    job.lease_ends = self._clock() + requeue_after_s
                    released.append(job.id)
            return released

    def finish_jobs(
        self, outcomes: Sequence[JobOutcome], *, now: datetime | None = None
    ) -> list[str]:
        with self._call("finish_jobs"):
            written = []
            for outcome in outcomes:
                job = self.jobs.get(outcome.job_id)
                if job is not None and job.status in (JobStatus.QUEUED, JobStatus.RUNNING):
                    job.status, job.outcome = outcome.status, outcome
                    job.finished_at = now or datetime.now(UTC)
                    written.append(job.id)
            return written

    def status(self, job_id: str) -> JobStatus:
        with self.changed:
            return self.jobs[job_id].status

    @contextmanager
    def _call(self, method: str) -> Iterator[None]:
        """One store call: under the store's lock, possibly failing, announced after."""
        with self.changed:
            self.calls[method] += 1
            try:
                times, error = self._failures.get(method, (0, StoreUnavailable))
                if times:
                    self._failures[method] = (times - 1, error)
                    raise error(f"the fake store is down ({method})")
                yield
            finally:
                self.changed.notify_all()


def _claimed(job: StoredJob) -> ClaimedJob:
    return ClaimedJob(
        id=job.id,
        model="fake",
        prompt_token_ids=[1, 2, 3],
        sampling=SamplingParams(max_tokens=job.max_tokens),
        created_at=datetime.now(UTC),
        batch_id=job.batch_id,
        priority=job.priority,
        attempts=job.claims,
    )


class MemoryPubSub:
    """Redis pub/sub in memory: `pubsub()` as `redis.Redis` has it (subscribe, get_message,
    close), and `publish` delivering to every open subscription of the channel. `drop()`
    makes each open subscription's next read raise the driver's `ConnectionError`."""

    def __init__(self) -> None:
        self.subscriptions: list[_Subscription] = []
        self.changed = threading.Condition()

    def pubsub(self, *, ignore_subscribe_messages: bool = False) -> _Subscription:
        assert ignore_subscribe_messages, "subscribe confirmations are not faked"
        with self.changed:
            subscription = _Subscription(self)
            self.subscriptions.append(subscription)
            return subscription

    def publish(self, channel: str, data: bytes) -> int:
        with self.changed:
            heard = [s for s in self.open() if channel in s.channels]
        for subscription in heard:
            message = {"type": "message", "channel": channel.encode(), "data": data}
            subscription.messages.put(message)
        return len(heard)

    def drop(self) -> None:
        for subscription in self.open():
            subscription.messages.put(None)

    def open(self) -> list[_Subscription]:
        with self.changed:
            return [s for s in self.subscriptions if not s.closed]

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)


class _Subscription:
    def __init__(self, server: MemoryPubSub) -> None:
        self.channels: set[str] = set()
        self.closed = False
        self.messages: queue.SimpleQueue[dict[str, object] | None] = queue.SimpleQueue()
        self._server = server

    def subscribe(self, *channels: str) -> None:
        with self._server.changed:
            self.channels.update(channels)
            self._server.changed.notify_all()

    def get_message(self, timeout: float = 0.0) -> dict[str, object] | None:
        try:
            message = self.messages.get(timeout=timeout)
        except queue.Empty:
            return None
        if message is None:
            raise RedisConnectionError("the fake Redis dropped the connection")
        return message

    def close(self) -> None:
        with self._server.changed:
            self.closed = True
            self._server.changed.notify_all()


class KeptTokens:
    """A `TokenStreamWriter` that keeps each write's events. `hold` makes writes wait until
    `go` is set; `fail(times)` makes the next writes raise."""

    def __init__(self) -> None:
        self.writes: list[list[TokenEvent]] = []
        self.writing = threading.Event()
        self.go = threading.Event()
        self.go.set()
        self.changed = threading.Condition()
        self._failures = 0

    def hold(self) -> None:
        self.go.clear()

    def fail(self, times: int = 1) -> None:
        with self.changed:
            self._failures = times

    def write(self, events: Sequence[TokenEvent]) -> None:
        self.writing.set()
        self.go.wait(10)
        with self.changed:
            try:
                if self._failures:
                    self._failures -= 1
                    raise RedisConnectionError("the fake token stream is down")
                self.writes.append(list(events))
            finally:
                self.changed.notify_all()

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float = 10) -> bool:
        with self.changed:
            return self.changed.wait_for(predicate, timeout_s)
