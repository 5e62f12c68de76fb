"""The GPU runtime: what a Celery task calls to run jobs, and the threads behind it.

A task claims its jobs in Postgres, hands them to the admission queue and blocks until
the writer has committed their outcomes; only then does Celery acknowledge the message.

Single jobs are also offered by pub/sub the moment they are submitted. They are taken that
way only when batch chunks wait here for room: then the worker's slots are (or are about
to be) all held by messages that end only when whole chunks end, and a single job's own
message could not be fetched until then. The worker claims them straight from Postgres,
and their messages, when they come, find them taken and are acknowledged. The messages
stay the durable path.

On shutdown the runtime drains: nothing new is admitted, jobs not yet in the engine go
back to queued at once, jobs in the engine get `drain_timeout_s` to finish, and whatever
is left is aborted and goes back too. A task whose jobs went back raises `JobsReturned`,
so its message returns to Redis instead of being acknowledged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime

from inferq.db.jobs import JobStore
from inferq.events import FinishedJobs
from inferq.exceptions import JobsReturned, StoreUnavailable
from inferq.jobs import ClaimedJob, JobOutcome, engine_priority
from inferq.settings import Settings
from inferq.token_stream import TokenEvent
from worker.admission import AdmissionQueue
from worker.capacity import CapacityGate
from worker.engine import Engine, EngineRequest, build_engine
from worker.loop import EngineLoop
from worker.metrics import WorkerMetrics
from worker.writer import ResultWriter

log = logging.getLogger(__name__)

MAX_CLAIM_BACKOFF_S = 5.0
DRAIN_POLL_S = 0.1
# How long a single job offered by pub/sub may wait for room here before this worker
# leaves it to its Celery message.
OFFER_WAIT_S = 2.0
OFFER_THREADS = 4


class Ticket:
    """A task's handle on one job: set when the job has ended here, one way or another."""

    __slots__ = ("batch_id", "created_at", "done", "returned")

    def __init__(self, created_at: datetime, batch_id: str | None) -> None:
        self.done = threading.Event()
        self.returned = False
        self.created_at = created_at
        self.batch_id = batch_id


@dataclass(frozen=True)
class Throughput:
    """Work committed over the last minute."""

    jobs: int
    prompt_tokens: int
    generated_tokens: int


class _RollingMinute:
    """Counts of committed work in the last 60 seconds."""

    def __init__(self) -> None:
        self._events: deque[tuple[float, int, int, int]] = deque()
        self._lock = threading.Lock()

    def add(self, jobs: int, prompt_tokens: int, generated_tokens: int) -> None:
        with self._lock:
            self._events.append((time.monotonic(), jobs, prompt_tokens, generated_tokens))

    def total(self) -> Throughput:
        horizon = time.monotonic() - 60
        with self._lock:
            while self._events and self._events[0][0] < horizon:
                self._events.popleft()
            events = list(self._events)
        return Throughput(
            jobs=sum(e[1] for e in events),
            prompt_tokens=sum(e[2] for e in events),
            generated_tokens=sum(e[3] for e in events),
        )


class GpuRuntime:
    """Owns the engine loop, the writer and the leases of one GPU worker process."""

    def __init__(
        self,
        *,
        store: JobStore,
        engine: Engine,
        engine_factory: Callable[[], Engine],
        events: FinishedJobs,
        worker_name: str,
        max_num_seqs: int,
        interactive_seqs: int = 0,
        max_batch_size: int,
        max_batch_delay_ms: int,
        max_held_jobs: int,
        interactive_held_jobs: int = 0,
        max_messages: int,
        result_flush_ms: int,
        lease_s: int,
        requeue_after_s: int,
        max_engine_deaths: int,
        on_fatal: Callable[[BaseException], None],
        metrics: WorkerMetrics,
        on_batch_lines_done: Callable[[set[str]], None] | None = None,
        on_tokens: Callable[[Sequence[TokenEvent]], None] | None = None,
    ) -> None:
        self._store = store
        self._events = events
        self.worker_name = worker_name
        self._lease_s = lease_s
        self._requeue_after_s = requeue_after_s
        self._metrics = metrics
        self._on_batch_lines_done = on_batch_lines_done
        self.last_minute = _RollingMinute()
        self.admission = AdmissionQueue(
            max_batch_size=max_batch_size, max_batch_delay_ms=max_batch_delay_ms
        )
        self._writer = ResultWriter(
            store=store, flush_ms=result_flush_ms, on_committed=self._committed
        )
        self.loop = EngineLoop(
            engine=engine,
            engine_factory=engine_factory,
            admission=self.admission,
            on_outcome=self._writer.put,
            on_fatal=on_fatal,
            metrics=metrics,
            max_num_seqs=max_num_seqs,
            interactive_seqs=interactive_seqs,
            max_engine_deaths=max_engine_deaths,
            on_tokens=on_tokens,
        )
        self._tickets: dict[str, Ticket] = {}
        self._gate = CapacityGate(max_held_jobs, interactive_extra=interactive_held_jobs)
        self._max_messages = max_messages
        self._tasks = 0  # Celery tasks inside `run`: each holds a message slot
        self._offers = ThreadPoolExecutor(OFFER_THREADS, thread_name_prefix="offers")
        # Job ids of tasks waiting at the gate: delivered here, not yet claimed.
        self._waiting: dict[int, list[str]] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._draining = threading.Event()
        metrics.jobs_held.set_function(lambda: len(self._tickets))
        self._lease_thread = threading.Thread(target=self._keep_leases, name="leases", daemon=True)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        store: JobStore,
        engine: Engine,
        events: FinishedJobs,
        worker_name: str,
        on_fatal: Callable[[BaseException], None],
        metrics: WorkerMetrics,
        on_batch_lines_done: Callable[[set[str]], None] | None = None,
        on_tokens: Callable[[Sequence[TokenEvent]], None] | None = None,
    ) -> GpuRuntime:
        return cls(
            store=store,
            engine=engine,
            engine_factory=lambda: build_engine(settings),
            events=events,
            worker_name=worker_name,
            max_num_seqs=settings.max_num_seqs,
            interactive_seqs=settings.effective_interactive_seqs,
            max_batch_size=settings.max_batch_size,
            max_batch_delay_ms=settings.max_batch_delay_ms,
            # Claim what the engine will soon run: a full engine plus a micro-batch waiting.
            max_held_jobs=settings.max_num_seqs + settings.max_batch_size,
            interactive_held_jobs=settings.effective_interactive_seqs,
            max_messages=settings.effective_worker_concurrency,
            result_flush_ms=settings.result_flush_ms,
            lease_s=settings.lease_s,
            requeue_after_s=settings.requeue_after_s,
            max_engine_deaths=settings.max_engine_deaths,
            on_fatal=on_fatal,
            metrics=metrics,
            on_batch_lines_done=on_batch_lines_done,
            on_tokens=on_tokens,
        )

    def start(self) -> None:
        self._writer.start()
        self.loop.start()
        self._lease_thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._offers.shutdown(wait=False, cancel_futures=True)
        self.loop.stop()
        self._writer.stop()
        self._lease_thread.join(5)

    @property
    def held(self) -> int:
        """Jobs this worker holds: pending admission, in the engine, or being written."""
        return len(self._tickets)

    def run(self, job_ids: Sequence[str], *, interactive: bool) -> None:
        """Run these jobs and return once each has ended (written, skipped or aborted).

        Raises `JobsReturned` if the worker is shutting down and gave any of them back.
        """
        if self._draining.is_set():
            raise JobsReturned("the worker is shutting down")
        with self._lock:
            self._tasks += 1
        try:
            self._run(job_ids, interactive=interactive)
        finally:
            with self._lock:
                self._tasks -= 1

    def offer(self, job_ids: Sequence[str]) -> None:
        """Single jobs just submitted (see the module doc); returns at once."""
        with self._lock:
            # Only batch chunks: a newer single job must not jump older ones.
            saturated = self._gate.bulk_waiting > 0
        if saturated and not self._draining.is_set() and not self._stopping.is_set():
            self._offers.submit(self._take_offered, list(job_ids))

    def _take_offered(self, job_ids: list[str]) -> None:
        with self._lock:
            fresh = [j for j in job_ids if j not in self._tickets]
        if not fresh or not self._gate.acquire(
            len(fresh), interactive=True, timeout_s=OFFER_WAIT_S
        ):
            return
        try:
            claimed = self._store.claim_jobs(fresh, worker=self.worker_name, lease_s=self._lease_s)
        except StoreUnavailable:
            claimed = []  # their messages will bring them
        self._gate.release(len(fresh) - len(claimed))
        if claimed:
            log.debug("took %d single jobs offered while every message slot was held", len(claimed))
        self._admit(claimed, interactive=True)

    def _run(self, job_ids: Sequence[str], *, interactive: bool) -> None:
        with self._lock:
            known = [self._tickets[j] for j in job_ids if j in self._tickets]
            fresh = [j for j in job_ids if j not in self._tickets]
        claimed = self._take(fresh, interactive=interactive) if fresh else []
        tickets = self._admit(claimed, interactive=interactive)
        for ticket in (*known, *tickets):
            ticket.done.wait()
        if any(ticket.returned for ticket in (*known, *tickets)):
            raise JobsReturned(f"{len(job_ids)} jobs went back to the queue")

    def _admit(self, claimed: Sequence[ClaimedJob], *, interactive: bool) -> list[Ticket]:
        """Tickets for jobs just claimed, and the jobs into the admission queue."""
        tickets = []
        with self._lock:
            for job in claimed:
                ticket = self._tickets.setdefault(job.id, Ticket(job.created_at, job.batch_id))
                tickets.append(ticket)
        self.admission.put(
            [
                EngineRequest(
                    job_id=job.id,
                    prompt_token_ids=job.prompt_token_ids,
                    sampling=job.sampling,
                    created_at=job.created_at,
                    priority=engine_priority(job.priority, interactive=interactive),
                    stream=job.stream,
                )
                for job in claimed
            ],
            interactive=interactive,
        )
        if self._draining.is_set():  # the drain may have missed jobs claimed just now
            stranded = self.admission.remove({job.id for job in claimed})
            self._give_back([r.job_id for r in stranded])
        return tickets

    def drain(self, timeout_s: float) -> None:
        """Stop taking work, let jobs in the engine finish (up to `timeout_s`), give back
        the rest. Called once, when the worker is told to shut down."""
        if self._draining.is_set():
            return
        self._draining.set()
        self._gate.close()
        self.loop.stop_admitting()
        pending = [r.job_id for r in self.admission.drain()]
        self._give_back(pending)
        log.info(
            "draining: %d jobs went back to the queue; %d in the engine get %.0f s to finish",
            len(pending),
            self.loop.in_flight,
            timeout_s,
        )
        deadline = time.monotonic() + timeout_s
        while self.loop.in_flight and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
        with self._lock:
            left = [job_id for job_id, t in self._tickets.items() if not t.done.is_set()]
        if left:
            log.warning("drain timeout: %d unfinished jobs go back to the queue", len(left))
            self.loop.abort(left)
            self._give_back(left)

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Stop work on jobs that were cancelled (or taken by another worker)."""
        with self._lock:
            mine = [j for j in job_ids if j in self._tickets]
        if mine:
            self.loop.abort(mine)
            self._release(mine)

    def _take(self, job_ids: list[str], *, interactive: bool) -> list[ClaimedJob]:
        """Wait for room at the gate, then claim; room not used by a claim is given back."""
        token = threading.get_ident()
        with self._lock:
            self._waiting[token] = job_ids
        try:
            if not self._gate.acquire(len(job_ids), interactive=interactive):
                raise JobsReturned("the worker is shutting down")
        finally:
            with self._lock:
                self._waiting.pop(token, None)
        claimed = self._claim(job_ids)
        self._gate.release(len(job_ids) - len(claimed))
        return claimed

    def _claim(self, job_ids: list[str]) -> list[ClaimedJob]:
        backoff = 0.1
        while True:
            try:
                return self._store.claim_jobs(
                    job_ids, worker=self.worker_name, lease_s=self._lease_s
                )
            except StoreUnavailable as exc:
                log.warning("cannot claim %d jobs yet (%s); retrying", len(job_ids), exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_CLAIM_BACKOFF_S)

    def _committed(self, outcomes: Sequence[JobOutcome], written: Sequence[str]) -> None:
        self._events.finished(written)
        now = datetime.now(UTC)
        done = set(written)
        with self._lock:
            tickets = [self._tickets.get(o.job_id) for o in outcomes if o.job_id in done]
        created = [ticket.created_at for ticket in tickets if ticket is not None]
        batch_ids = {t.batch_id for t in tickets if t is not None and t.batch_id is not None}
        for created_at in created:
            self._metrics.job_latency.observe((now - created_at).total_seconds())
        results = [o.result for o in outcomes if o.result is not None and o.job_id in done]
        self.last_minute.add(
            len(done),
            sum(r.prompt_tokens for r in results),
            sum(r.completion_tokens for r in results),
        )
        self._release([o.job_id for o in outcomes])
        self._check_batches(batch_ids)

    def _check_batches(self, batch_ids: set[str]) -> None:
        """Ask whether these batches have ended, unless a line of theirs is still held
        here (then they have not: it saves a query on every write)."""
        if not batch_ids or self._on_batch_lines_done is None:
            return
        with self._lock:
            unfinished = {t.batch_id for t in self._tickets.values()}
        if ended := batch_ids - unfinished:
            try:
                self._on_batch_lines_done(ended)
            except Exception:  # maintenance's sweep finalizes what this misses
                log.warning("could not check batches %s for completion", ended, exc_info=True)

    def _release(self, job_ids: Sequence[str], *, returned: bool = False) -> None:
        with self._lock:
            tickets = [t for t in (self._tickets.pop(j, None) for j in job_ids) if t is not None]
        self._gate.release(len(tickets))
        for ticket in tickets:
            ticket.returned = returned
            ticket.done.set()

    def _give_back(self, job_ids: Sequence[str]) -> None:
        """Return unfinished jobs to queued in Postgres, then release their tasks."""
        if not job_ids:
            return
        for attempt in range(5):
            try:
                self._store.release_jobs(
                    job_ids, worker=self.worker_name, requeue_after_s=self._requeue_after_s
                )
                break
            except StoreUnavailable as exc:
                # Their leases will lapse and maintenance will publish them: still safe.
                log.warning("cannot give back %d jobs yet (%s)", len(job_ids), exc)
                time.sleep(0.5 * (attempt + 1))
        self._release(job_ids, returned=True)

    def _keep_leases(self) -> None:
        interval = self._lease_s / 3
        while not self._stopping.wait(interval):
            with self._lock:
                held = list(self._tickets)
                waiting = [job_id for ids in self._waiting.values() for job_id in ids]
            try:
                # Their messages are here, alive: maintenance must not think them lost.
                self._store.touch_published(waiting)
            except StoreUnavailable as exc:
                log.warning("cannot mark %d waiting jobs (%s)", len(waiting), exc)
            try:
                lost = self._store.renew_leases(
                    held, worker=self.worker_name, lease_s=self._lease_s
                )
            except StoreUnavailable as exc:
                log.warning("cannot renew %d leases (%s)", len(held), exc)
                continue
            if lost:
                log.info("%d jobs were cancelled or taken over; dropping them", len(lost))
                self.cancel(sorted(lost))
