"""The GPU runtime: what a Celery task calls to run jobs, and the pieces behind it.

`ask` asks the door (worker/door.py) for a single job's jobs and claims what fits; the
feeder (worker/feeder.py) claims the rest and batch lines; claims enter the admission
queue, the engine loop runs them and the writer commits their outcomes, after which the
pool (worker/pool.py) reports the message's task done. While jobs are held, the lease
keeper (worker/leases.py) renews them. On shutdown `drain` admits nothing new, gives back
the jobs not in the engine at once, lets those in it finish for `drain_timeout_s`, and
aborts and gives back the rest with their messages."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from inferq.broker.events import FinishedJobs, announced_result
from inferq.broker.token_stream import TokenEvent
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
from worker.loop import EngineLoop
from worker.metrics import WorkerMetrics
from worker.speedometer import Speedometer
from worker.store import WorkerStore
from worker.throughput import RollingMinute
from worker.writer import ResultWriter

log = logging.getLogger(__name__)

DRAIN_POLL_S = 0.1
GIVE_BACK_ATTEMPTS = 5


class EngineRuntime:
    """Owns the engine loop, the writer and the leases of one GPU worker process."""

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
        interactive_held_jobs: int = 0,
        result_flush_ms: int,
        lease_s: int,
        requeue_after_s: int,
        max_engine_deaths: int,
        on_fatal: Callable[[BaseException], None],
        metrics: WorkerMetrics,
        pooling: bool = False,
        batch_queue: str | None = None,
        on_batch_lines_done: Callable[[set[str]], None] | None = None,
        on_tokens: Callable[[Sequence[TokenEvent]], None] | None = None,
    ) -> None:
        """`pooling`: the engine embeds rather than generates (its speed is counted in
        prompt tokens). `batch_queue`: the queue whose batch lines the feeder claims (None:
        this runtime runs single jobs only)."""
        self._events = events
        self.worker_name = worker_name
        self._metrics = metrics
        self._on_batch_lines_done = on_batch_lines_done
        self.last_minute = RollingMinute()
        self.speed = Speedometer(max_num_seqs=max_num_seqs, pooling=pooling)
        self.admission = AdmissionQueue(
            max_batch_size=max_batch_size, max_batch_delay_ms=max_batch_delay_ms
        )
        self._writer = ResultWriter(
            store=store,
            flush_ms=result_flush_ms,
            on_committed=self._committed,
            # Jobs held that the writer has not been given: in the engine, or on their way.
            more_coming=lambda: len(self._door) > self._writer.pending,
        )
        self.loop = EngineLoop(
            engine=engine,
            engine_factory=engine_factory,
            admission=self.admission,
            on_outcome=self._writer.put,
            on_fatal=on_fatal,
            metrics=metrics,
            speed=self.speed,
            max_num_seqs=max_num_seqs,
            interactive_seqs=interactive_seqs,
            max_engine_deaths=max_engine_deaths,
            on_tokens=on_tokens,
        )
        self._store = store
        self._requeue_after_s = requeue_after_s
        self._door = Door(max_held_jobs, interactive_extra=interactive_held_jobs)
        self._leases = LeaseKeeper(
            store=store,
            worker_name=worker_name,
            lease_s=lease_s,
            held=self._door.held_ids,
            waiting=self._door.asked_ids,
            on_lost=self.cancel,
        )
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
            on_claimed=self._admit,
            peers=lambda: self.peers,
        )
        # Messages taken since start, and those whose jobs have not all ended: the stall
        # watch's reading of progress (inferq/host/stall.py).
        self._taken = 0
        self._running = 0
        self._counts = threading.Lock()
        self._draining = threading.Event()
        metrics.jobs_held.set_function(lambda: len(self._door))
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
        on_batch_lines_done: Callable[[set[str]], None] | None = None,
        on_tokens: Callable[[Sequence[TokenEvent]], None] | None = None,
    ) -> EngineRuntime:
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
            result_flush_ms=settings.result_flush_ms,
            lease_s=settings.lease_s,
            requeue_after_s=settings.requeue_after_s,
            max_engine_deaths=settings.max_engine_deaths,
            on_fatal=on_fatal,
            metrics=metrics,
            pooling=settings.runner == "pooling",
            batch_queue=batch_queue,
            on_batch_lines_done=on_batch_lines_done,
            on_tokens=on_tokens,
        )

    def start(self) -> None:
        """Start its threads: each after the ones it hands work to."""
        self._threads.start()

    def stop(self) -> None:
        """Stop its threads, in the reverse order: claims stop first, writes last."""
        self._threads.stop()

    @property
    def held(self) -> int:
        """Jobs this worker holds: pending admission, in the engine, or being written."""
        return len(self._door)

    def progress(self, *, slots: int) -> tuple[int, bool]:
        """Messages taken so far, and whether another would be taken now: fewer than
        `slots` messages wait on their jobs and the door has room."""
        room = self._door.has_room
        with self._counts:
            return self._taken, self._running < slots and room

    def wake_batches(self) -> None:
        """Batch lines may be waiting: the feeder looks for them now."""
        self._door.wake()

    def ask(self, job_ids: Sequence[str]) -> Callable[[Callable[[bool], None]], None]:
        """Ask for these single jobs at the door, claim them if they fit (else the feeder
        will, once they do), and return. Returns `then`:
        `then(on_end)` has `on_end(returned)` called once each job has ended (written,
        skipped or aborted), from the thread that ended the last (or at once), with
        `returned` saying whether any went back to the queue.

        Raises `JobsReturned` if the worker is shutting down."""
        if self._draining.is_set():
            raise JobsReturned("the worker is shutting down")
        with self._counts:
            self._taken += 1
            self._running += 1
        tickets = self._door.ask(job_ids)
        self._feeder.claim_asked()

        def then(on_end: Callable[[bool], None]) -> None:
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

        return then

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Stop work on jobs that were cancelled (or taken by another worker)."""
        if mine := self._door.cancel(job_ids):
            self.loop.abort(mine)
            self._release(mine)

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
        # and not in the admission queue yet (`_admit` gives them back too).
        if left := self._door.held_ids():
            log.info("drained: %d jobs not in the engine go back to the queue", len(left))
            self.loop.abort(left)
            self._give_back(left)

    def _admit(self, claimed: Sequence[ClaimedJob], interactive: bool) -> None:
        """Jobs just claimed and held, into the admission queue."""
        self.admission.put(
            [
                EngineRequest(
                    job_id=job.id,
                    model=job.model,
                    prompt_token_ids=job.prompt_token_ids,
                    sampling=job.sampling,
                    created_at=job.created_at,
                    # A batch line's place was decided by its claim (worker/feeder.py):
                    # the engine runs every line at one priority, behind single jobs.
                    priority=engine_priority(
                        job.priority if interactive else 0, interactive=interactive
                    ),
                    stream=job.stream,
                )
                for job in claimed
            ],
            interactive=interactive,
        )
        # One cancelled between its hold and the put was released, and may have missed
        # the abort that should have taken it out of the admission queue.
        if gone := self._door.not_held([job.id for job in claimed]):
            self.loop.abort(gone)
        if self._draining.is_set():  # the drain may have missed jobs claimed just now
            stranded = self.admission.remove({job.id for job in claimed})
            self._give_back([r.job_id for r in stranded])

    def _committed(self, outcomes: Sequence[JobOutcome], written: Sequence[str]) -> None:
        now = datetime.now(UTC)
        done = set(written)
        tickets = self._door.tickets([o.job_id for o in outcomes if o.job_id in done])
        batch_ids = {t.batch_id for t in tickets if t.batch_id is not None}
        # A single job's result goes with its announcement: its waiter need not read it.
        announced = {
            o.job_id: announced_result(o.result)
            for o in outcomes
            if o.result is not None and not o.bulk and o.job_id in done
        }
        self._events.finished(written, batch_ids=sorted(batch_ids), results=announced)
        for ticket in tickets:
            if ticket.created_at is not None:
                self._metrics.job_latency.observe((now - ticket.created_at).total_seconds())
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
        if ended := batch_ids - self._door.batch_ids():
            try:
                self._on_batch_lines_done(ended)
            except Exception:  # maintenance's sweep finalizes what this misses
                log.warning("could not check batches %s for completion", ended, exc_info=True)

    def _release(self, job_ids: Sequence[str], *, returned: bool = False) -> None:
        self._door.release(job_ids, returned=returned)

    def _give_back(self, job_ids: Sequence[str]) -> None:
        """Return unfinished jobs to queued in Postgres, then release their tasks."""
        if not job_ids:
            return
        for attempt in range(GIVE_BACK_ATTEMPTS):
            try:
                self._store.release_jobs(
                    job_ids, worker=self.worker_name, requeue_after_s=self._requeue_after_s
                )
                break
            except StoreUnavailable as exc:
                # Their leases will lapse and maintenance will publish them: still safe,
                # only later.
                log.warning("cannot give back %d jobs yet (%s)", len(job_ids), exc)
                time.sleep(0.5 * (attempt + 1))
        self._release(job_ids, returned=True)
