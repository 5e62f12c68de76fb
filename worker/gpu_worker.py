"""The GPU worker's path for jobs, top-down: a message, a claim, the engine, a write, an end.

1. `take`: a message's task asks the door (worker/door.py) for its single jobs; the
   feeder (worker/feeder.py) claims what fits, and batch lines whenever there is room.
2. `admit`: the feeder hands what it claimed here; it goes into the admission queue.
3. The engine loop (worker/loop.py) steps the engine and hands each outcome to the
   result writer (worker/writer.py), which commits them in flushes.
4. `committed`: after each commit, the jobs end: their ends are announced, and each
   message whose jobs have all ended is acknowledged by the pool (worker/pool.py).
The lease keeper (worker/leases.py) renews held jobs meanwhile; `drain` ends it all."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from inferq.broker.events import FinishedJobs, announce_end
from inferq.domain.jobs import ClaimedJob, JobOutcome, engine_priority
from inferq.exceptions import JobsReturned, StoreUnavailable
from inferq.host import supervision
from inferq.settings import Settings
from worker.admission import AdmissionQueue
from worker.door import Door, Ticket
from worker.engine.factory import build_engine
from worker.engine.protocol import Engine, EngineRequest
from worker.feeder import Feeder
from worker.leases import LeaseKeeper
from worker.loop import EngineLoop, Tokens
from worker.metrics import WorkerMetrics
from worker.pool import Wait
from worker.speedometer import Speedometer
from worker.store import WorkerStore
from worker.throughput import RollingMinute
from worker.writer import ResultWriter

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.1
GIVE_BACK_ATTEMPTS = 5


class Batches(Protocol):
    """Told when no line of some batches is held here any more: each may have ended."""

    def lines_ended(self, batch_ids: set[str]) -> None: ...


class GpuWorker:
    """One GPU worker's pieces, and the calls that take a job through them."""

    def __init__(
        self,
        *,
        store: WorkerStore,
        engine: Engine,
        engine_factory: Callable[[], Engine],
        events: FinishedJobs,
        worker_name: str,
        max_num_seqs: int,
        interactive_seqs: int = 0,
        max_batch_size: int,
        max_batch_delay_ms: int,
        max_held_jobs: int,
        single_extra_held: int = 0,
        result_flush_ms: int,
        lease_s: int,
        requeue_after_s: int,
        max_engine_deaths: int,
        on_fatal: Callable[[BaseException], None],
        metrics: WorkerMetrics,
        pooling: bool = False,
        batch_queue: str | None = None,
        batches: Batches | None = None,
        tokens: Tokens | None = None,
    ) -> None:
        """`pooling`: the engine embeds rather than generates (its speed is counted in
        prompt tokens). `batch_queue`: the queue whose batch lines the feeder claims (None:
        single jobs only). `batches` hears of batches whose lines may all have ended,
        `tokens` takes streamed jobs' tokens."""
        self._store = store
        self._events = events
        self.worker_name = worker_name
        self._metrics = metrics
        self._batches = batches
        self._requeue_after_s = requeue_after_s
        self.last_minute = RollingMinute()
        self.speed = Speedometer(max_num_seqs=max_num_seqs, pooling=pooling)
        self._door = Door(max_held_jobs, single_extra=single_extra_held)
        # Workers that share this one's batch lines, itself included (the heartbeat
        # counts them): each claims no more than its share of what is left.
        self.peers = 1
        self._feeder = Feeder(
            store=store,
            door=self._door,
            batch_queue=batch_queue,
            worker_name=worker_name,
            lease_s=lease_s,
            micro_batch=max_batch_size,
            admits=self,
            peers=lambda: self.peers,
        )
        self.admission = AdmissionQueue(
            max_batch_size=max_batch_size, max_batch_delay_ms=max_batch_delay_ms
        )
        self._writer = ResultWriter(store=store, flush_ms=result_flush_ms, ends=self)
        self.loop = EngineLoop(
            engine=engine,
            engine_factory=engine_factory,
            admission=self.admission,
            writer=self._writer,
            on_fatal=on_fatal,
            metrics=metrics,
            speed=self.speed,
            max_num_seqs=max_num_seqs,
            interactive_seqs=interactive_seqs,
            max_engine_deaths=max_engine_deaths,
            tokens=tokens,
        )
        self._leases = LeaseKeeper(
            store=store, worker_name=worker_name, lease_s=lease_s, holder=self
        )
        # Messages taken since start, and those whose jobs have not all ended: the stall
        # watch's reading of progress (inferq/host/stall.py).
        self._taken = 0
        self._running = 0
        self._counts = threading.Lock()
        self._draining = threading.Event()
        metrics.jobs_held.set_function(lambda: len(self._door))
        # Each started after the pieces it hands work to, stopped in the reverse order.
        self._threads = supervision.SideThreads(self._writer, self.loop, self._leases, self._feeder)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        *,
        store: WorkerStore,
        engine: Engine,
        events: FinishedJobs,
        worker_name: str,
        on_fatal: Callable[[BaseException], None],
        metrics: WorkerMetrics,
        batch_queue: str | None = None,
        batches: Batches | None = None,
        tokens: Tokens | None = None,
    ) -> GpuWorker:
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
            # Claim what the engine will soon run: a full engine plus a micro-batch waiting,
            # and room for the next claim, of a micro-batch (worker/feeder.py), while the
            # engine stays full: fewer, larger claims.
            max_held_jobs=settings.max_num_seqs + 2 * settings.max_batch_size,
            single_extra_held=settings.effective_interactive_seqs,
            result_flush_ms=settings.result_flush_ms,
            lease_s=settings.lease_s,
            requeue_after_s=settings.requeue_after_s,
            max_engine_deaths=settings.max_engine_deaths,
            on_fatal=on_fatal,
            metrics=metrics,
            pooling=settings.runner == "pooling",
            batch_queue=batch_queue,
            batches=batches,
            tokens=tokens,
        )

    def start(self) -> None:
        """Start its threads: each after the ones it hands work to."""
        self._threads.start()

    def stop(self) -> None:
        """Stop its threads, in the reverse order: claims stop first, writes last."""
        self._threads.stop()

    # 1. A message: its single jobs are asked for at the door, and claimed once they fit.

    def take(self, job_ids: Sequence[str]) -> Wait:
        """Ask for a message's single jobs at the door; the feeder claims them once they
        fit. Returns the message's `Wait` (worker/pool.py): its jobs end on the writer's thread.

        Raises `JobsReturned` if the worker is shutting down."""
        if self._draining.is_set():
            raise JobsReturned("the worker is shutting down")
        with self._counts:
            self._taken += 1
            self._running += 1
        tickets = self._door.ask(job_ids)
        self._feeder.claim_asked()

        def wait(on_end: Callable[[bool], None]) -> None:
            left = len(tickets)
            returned = False
            lock = threading.Lock()

            def ended(ticket: Ticket) -> None:
                nonlocal left, returned
                with lock:
                    left -= 1
                    returned = returned or ticket.returned
                    if left:
                        return
                with self._counts:
                    self._running -= 1
                try:
                    on_end(returned)
                except Exception:  # the thread that ended the job must go on
                    log.exception("reporting the end of jobs %s failed", ", ".join(job_ids))

            for ticket in tickets:
                ticket.when_ended(ended)

        return wait

    def wake_batches(self) -> None:
        """A batch's message: lines may be waiting, and the feeder looks for them now."""
        self._door.wake()

    # 2. Claimed (by the feeder, on its thread): into the admission queue.

    def admit(self, claimed: Sequence[ClaimedJob], *, single: bool) -> None:
        """Jobs just claimed and held go into the admission queue, where the engine loop
        takes them as the engine has room."""
        requests = [_engine_request(job, single=single) for job in claimed]
        self.admission.put(requests, single=single)
        # One cancelled between its hold and the put was given up, and may have missed
        # the abort that should have taken it out of the admission queue.
        if gone := self._door.not_held([job.id for job in claimed]):
            self.loop.abort(gone)
        if self._draining.is_set():  # the drain may have missed jobs claimed just now
            unstarted = self.admission.remove({job.id for job in claimed})
            self._give_back([r.job_id for r in unstarted])

    # 3. The engine loop runs them, and hands each outcome to the writer (worker/loop.py).

    # 4. Written (on the writer's thread, after each commit): the jobs end.

    def committed(
        self, outcomes: Sequence[JobOutcome], written: Sequence[str], *, finished_at: datetime
    ) -> None:
        """Announce the jobs' ends, end their tickets (a message whose jobs have all ended
        is acknowledged then), and look at the batches whose lines these were."""
        now = datetime.now(UTC)
        done = set(written)
        held = self._door.tickets([o.job_id for o in outcomes if o.job_id in done])
        tickets = list(held.values())
        batch_ids = {t.batch_id for t in tickets if t.batch_id is not None}
        # A single job's success goes with its announcement: its waiter need not read it.
        announced = {
            o.job_id: announce_end(
                o.result,
                started_at=o.started_at,
                finished_at=finished_at,
                attempts=held[o.job_id].attempts,
            )
            for o in outcomes
            if o.result is not None and o.started_at is not None and not o.bulk and o.job_id in held
        }
        # A batch line's end is announced on its batch's channel only, where a wait on it
        # listens (api/waiter.py): not on a channel of its own.
        singles = [j for j in written if j not in held or held[j].batch_id is None]
        self._events.finished(singles, batch_ids=sorted(batch_ids), results=announced)
        for ticket in tickets:
            if ticket.created_at is not None:
                self._metrics.job_latency.observe((now - ticket.created_at).total_seconds())
        results = [o.result for o in outcomes if o.result is not None and o.job_id in done]
        self.last_minute.add(
            len(done),
            sum(r.prompt_tokens for r in results),
            sum(r.completion_tokens for r in results),
        )
        self._door.let_go([o.job_id for o in outcomes])
        self._look_at_batches(batch_ids)

    def more_coming(self) -> bool:
        """Jobs held that the writer has not been given: in the engine, or on their way."""
        return len(self._door) > self._writer.pending

    def _look_at_batches(self, batch_ids: set[str]) -> None:
        """Tell `batches` of these batches, unless a line of theirs is still held here
        (then they have not ended: it saves a query on every write)."""
        if not batch_ids or self._batches is None:
            return
        if ended := batch_ids - self._door.batch_ids():
            try:
                self._batches.lines_ended(ended)
            except Exception:  # maintenance's sweep finalizes what this misses
                log.warning("could not check batches %s for completion", ended, exc_info=True)

    # Off the path: what the lease keeper, the heartbeat and the stall watch read, and
    # stopping work on jobs (a cancel, a lost lease, a shutdown).

    @property
    def held(self) -> int:
        """Jobs this worker holds: pending admission, in the engine, or being written."""
        return len(self._door)

    def held_ids(self) -> list[str]:
        return self._door.held_ids()

    def asked_ids(self) -> list[str]:
        return self._door.asked_ids()

    def progress(self, *, slots: int) -> tuple[int, bool]:
        """Messages taken so far, and whether another would be taken now: fewer than
        `slots` messages wait on their jobs and the door has room."""
        room = self._door.has_room
        with self._counts:
            return self._taken, self._running < slots and room

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Stop work on jobs that were cancelled (or taken by another worker)."""
        if mine := self._door.cancel(job_ids):
            self.loop.abort(mine)
            self._door.let_go(mine)

    def drain(self, timeout_s: float) -> None:
        """Stop taking work, let jobs in the engine or on their way in or out of it finish
        (up to `timeout_s`), give back the rest. Called once, when the worker is told to
        shut down."""
        if self._draining.is_set():
            return
        self._draining.set()
        self._door.close()
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
        # Not only the engine's jobs: the loop may be adding some that it took from the
        # admission queue, and finished ones wait for the writer (a job given back then
        # would run again elsewhere, its result here thrown away).
        while len(self._door) and (self.loop.busy or self._writer.pending):
            if time.monotonic() >= deadline:
                left = self._door.held_ids()
                log.warning("drain timeout: %d unfinished jobs go back to the queue", len(left))
                self.loop.abort(left)
                self._give_back(left)
                return
            time.sleep(DRAIN_POLL_S)
        # Held but going nowhere: on probation (the loop admits nothing now), or claimed
        # and not in the admission queue yet (`admit` gives them back too).
        if left := self._door.held_ids():
            log.info("drained: %d jobs not in the engine go back to the queue", len(left))
            self.loop.abort(left)
            self._give_back(left)

    def _give_back(self, job_ids: Sequence[str]) -> None:
        """Give unfinished jobs back (queued in Postgres), then let go of them: their
        messages go back to Redis."""
        if not job_ids:
            return
        for attempt in range(GIVE_BACK_ATTEMPTS):
            try:
                self._store.give_back_jobs(
                    job_ids, worker=self.worker_name, requeue_after_s=self._requeue_after_s
                )
                break
            except StoreUnavailable as exc:
                # Their leases will lapse and maintenance will publish them: still safe,
                # only later.
                log.warning("cannot give back %d jobs yet (%s)", len(job_ids), exc)
                time.sleep(0.5 * (attempt + 1))
        self._door.let_go(job_ids, returned=True)


def _engine_request(job: ClaimedJob, *, single: bool) -> EngineRequest:
    """A claimed job as the engine takes it. A batch line's place was decided by its claim
    (worker/feeder.py): the engine runs every line at one priority, behind single jobs;
    a single job of the flex tier runs as they do."""
    priority = engine_priority(job.priority if single else 0, single=single)
    return EngineRequest(
        job_id=job.id,
        model=job.model,
        prompt_token_ids=job.prompt_token_ids,
        sampling=job.sampling,
        created_at=job.created_at,
        priority=priority,
        stream=job.stream,
        bulk=not single or job.flex,
    )
