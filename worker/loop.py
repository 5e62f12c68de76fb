"""The engine loop: one thread that owns the engine, admits work and steps it.

After every engine step, pending requests fill the room finished sequences left, up to
`max_num_seqs` in flight: the loop never waits for a whole batch to finish
(docs/how-it-works.md, "Why continuous admission"). If the engine dies, the loop builds
a new one and admits the in-flight requests again; each request present counts a death.
A request at its last-but-one death runs alone (probation), so a further death implicates
it only; one present at `max_engine_deaths` deaths is failed as poison."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from inferq.broker.token_stream import RunStarted, TokenEvent
from inferq.domain.jobs import JobError, JobOutcome
from inferq.exceptions import EngineError, RequestRejected
from inferq.host import supervision
from worker.admission import AdmissionQueue
from worker.engine.protocol import Engine, EngineRequest
from worker.metrics import WorkerMetrics
from worker.speedometer import Speedometer

log = logging.getLogger(__name__)

# An idle loop waits this long for work; `AdmissionQueue.wake` (a stop, an abort) ends it.
IDLE_WAIT_S = 1.0
STATS_EVERY_S = 2.0


class Outcomes(Protocol):
    """Where the loop hands each job's outcome: the result writer (worker/writer.py)."""

    def put(self, outcome: JobOutcome) -> None: ...


class Tokens(Protocol):
    """Where streamed jobs' tokens go: the token publisher (worker/token_publisher.py).
    `put` must not block: it runs on the loop's thread."""

    def put(self, events: Sequence[TokenEvent]) -> None: ...


@dataclass
class _InFlight:
    request: EngineRequest
    admitted_at: datetime


class EngineLoop(supervision.SupervisedThread):
    """Runs the engine in its own thread; every engine call happens there. `stop` ends
    the stepping and closes the engine: the one the loop holds then, which after a crash
    is not the one it was given."""

    thread_name = "engine-loop"
    stop_timeout_s = 30

    def __init__(
        self,
        *,
        engine: Engine,
        engine_factory: Callable[[], Engine],
        admission: AdmissionQueue,
        writer: Outcomes,
        on_fatal: Callable[[BaseException], None],
        metrics: WorkerMetrics,
        speed: Speedometer,
        max_num_seqs: int,
        interactive_seqs: int = 0,
        max_engine_deaths: int = 3,
        tokens: Tokens | None = None,
    ) -> None:
        """`writer` is handed every outcome; `tokens`, in order, when each streamed request
        enters the engine and what every step adds to it."""
        self._engine = engine
        self._engine_factory = engine_factory
        self._admission = admission
        self._writer = writer
        self._on_fatal = on_fatal
        self._tokens = tokens
        self._max_num_seqs = max_num_seqs
        self._interactive_seqs = interactive_seqs
        self._max_engine_deaths = max_engine_deaths
        self._metrics = metrics
        self._speed = speed
        self._stats_at = 0.0
        # Kept by the loop thread, read by scrapes: a plain int is safe to read anywhere.
        self._sequences = 0
        metrics.sequences_in_flight.set_function(lambda: self._sequences)
        self._in_flight: dict[str, _InFlight] = {}
        self._deaths: dict[str, int] = {}
        self._probation: deque[EngineRequest] = deque()
        self._solo: str | None = None
        self._aborts: set[str] = set()
        self._aborts_lock = threading.Lock()
        self._admitting = threading.Event()
        self._admitting.set()
        self._taking = False  # requests are between the admission queue and `_in_flight`
        # CPU inside the engine's calls since the last step counted it (the metric's).
        self._engine_cpu_s = 0.0
        self.engine_restarts = 0
        super().__init__()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def busy(self) -> bool:
        """Whether requests are in the engine or on their way into it."""
        return self._taking or bool(self._in_flight)

    @property
    def sequences(self) -> int:
        """Sequences in the engine: a request with `n` completions counts `n`."""
        return self._sequences

    def abort(self, job_ids: Collection[str]) -> None:
        """Drop these jobs, pending or running (from any thread)."""
        with self._aborts_lock:
            self._aborts.update(job_ids)
        self._admission.wake()

    def stop_admitting(self) -> None:
        """Finish what is in flight, take nothing new."""
        self._admitting.clear()
        self._admission.wake()

    def _wake(self) -> None:
        self._admission.wake()

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                began = time.monotonic()
                self._apply_aborts()
                before = len(self._in_flight)
                self._admit_pending()
                if self._in_flight:
                    sequences = self._sequences
                    admitted = len(self._in_flight) > before
                    self._step()
                    # The whole turn, admission included: the rate a batch gets.
                    self._speed.stepped(
                        duration_s=time.monotonic() - began, sequences=sequences, admitted=admitted
                    )
                elif not self._admitting.is_set():
                    self._stopping.wait(IDLE_WAIT_S)
                self._sample_stats()
        except BaseException as exc:  # the loop must never die silently
            log.exception("the engine loop failed")
            self._on_fatal(exc)
            return
        self._engine.close()

    def _admit_pending(self) -> None:
        if not self._admitting.is_set() or self._solo is not None:
            return
        if self._probation:
            # A probationer waits for the engine to empty, then runs alone.
            if not self._in_flight:
                request = self._probation.popleft()
                self._solo = request.job_id
                self._admit(request, datetime.now(UTC))
            return
        room = self._max_num_seqs - len(self._in_flight)
        # Set before the take: a drain must never see a request that is in neither place.
        self._taking = True
        try:
            batch = self._admission.take(
                room,
                single_room=room + self._interactive_seqs,
                idle=not self._in_flight,
                timeout_s=IDLE_WAIT_S,
            )
            now = datetime.now(UTC)
            for request in batch:
                self._admit(request, now)
        finally:
            self._taking = False
        if batch:
            self._metrics.admission_batch_size.observe(len(batch))

    def _admit(self, request: EngineRequest, now: datetime) -> None:
        began = time.thread_time()
        try:
            self._engine.add(request)
        except RequestRejected as exc:
            self._engine_cpu_s += time.thread_time() - began
            self._fail(request.job_id, JobError(code="engine_rejected", message=exc.message))
            return
        except EngineError as exc:
            # Dead before the request went in: keep it, and recover on the next step.
            log.warning("engine died while admitting %s: %s", request.job_id, exc)
        self._engine_cpu_s += time.thread_time() - began
        if request.stream and self._tokens is not None:
            self._tokens.put([RunStarted(job_id=request.job_id)])
        self._in_flight[request.job_id] = _InFlight(request, now)
        self._sequences += request.sampling.sequences
        self._metrics.jobs_admitted.inc()
        if request.created_at is not None and request.job_id not in self._deaths:
            self._metrics.queue_wait.observe((now - request.created_at).total_seconds())

    def _step(self) -> None:
        began = time.thread_time()
        try:
            finished = self._engine.step()
            deltas = self._engine.deltas() if self._tokens is not None else []
        except EngineError as exc:
            self._count_engine_cpu(began)
            self._recover(exc)
            return
        self._count_engine_cpu(began)
        if deltas and self._tokens is not None:
            self._tokens.put(deltas)
        # Counted once a step, not once a job: a step ends dozens of short lines.
        reasons: Counter[str] = Counter()
        prompt_tokens = completion_tokens = 0
        for item in finished:
            entry = self._drop(item.job_id)
            if entry is None:  # aborted while it ran
                continue
            self._forget(item.job_id)
            result = item.result
            if result.embedding is not None:
                reason = "embedded"
            else:
                reason = (result.choices[0].finish_reason if result.choices else None) or "unknown"
            reasons[reason] += 1
            prompt_tokens += result.prompt_tokens
            completion_tokens += result.completion_tokens
            self._speed.finished(
                prompt_tokens=result.prompt_tokens,
                completion_tokens=result.completion_tokens,
                max_tokens=entry.request.sampling.max_tokens * entry.request.sampling.n,
                single=not entry.request.bulk,
            )
            self._writer.put(
                JobOutcome(
                    job_id=item.job_id,
                    result=result,
                    started_at=entry.admitted_at,
                    bulk=entry.request.bulk,
                )
            )
        for reason, count in reasons.items():
            self._metrics.jobs_finished.labels("succeeded", reason).inc(count)
        if reasons:
            self._metrics.prompt_tokens.inc(prompt_tokens)
            self._metrics.generation_tokens.inc(completion_tokens)

    def _count_engine_cpu(self, began: float) -> None:
        """Count the engine's CPU since `began` (this thread's clock), and its admissions'
        since the last step: once a step, not once a request."""
        self._metrics.engine_cpu.inc(self._engine_cpu_s + time.thread_time() - began)
        self._engine_cpu_s = 0.0

    def _apply_aborts(self) -> None:
        with self._aborts_lock:
            if not self._aborts:
                return
            aborts, self._aborts = self._aborts, set()
        self._admission.remove(aborts)
        self._probation = deque(r for r in self._probation if r.job_id not in aborts)
        for job_id in aborts:
            self._forget(job_id)
        running = [job_id for job_id in aborts if job_id in self._in_flight]
        for job_id in running:
            self._drop(job_id)
            self._metrics.jobs_finished.labels("aborted", "cancelled").inc()
        if running:
            try:
                self._engine.abort(running)
            except EngineError as exc:
                log.warning("engine died during an abort: %s", exc)

    def _drop(self, job_id: str) -> _InFlight | None:
        entry = self._in_flight.pop(job_id, None)
        if entry is not None:
            self._sequences -= entry.request.sampling.sequences
        return entry

    def _forget(self, job_id: str) -> None:
        self._deaths.pop(job_id, None)
        if self._solo == job_id:
            self._solo = None

    def _fail(self, job_id: str, error: JobError) -> None:
        log.warning("job %s failed: %s", job_id, error.message, extra={"job_id": job_id})
        entry = self._drop(job_id)
        self._forget(job_id)
        self._metrics.jobs_finished.labels("failed", error.code).inc()
        self._writer.put(
            JobOutcome(job_id=job_id, error=error, started_at=entry.admitted_at if entry else None)
        )

    def _recover(self, exc: EngineError) -> None:
        """Replace a dead engine and re-admit its requests, failing repeat offenders."""
        self.engine_restarts += 1
        self._metrics.engine_restarts.inc()
        log.error(
            "the engine died with %d requests in flight (%s); restarting it",
            len(self._in_flight),
            exc,
        )
        survivors: list[EngineRequest] = []
        self._solo = None
        for job_id, entry in list(self._in_flight.items()):
            deaths = self._deaths.get(job_id, 0) + 1
            self._deaths[job_id] = deaths
            if deaths == self._max_engine_deaths - 1:
                self._probation.append(entry.request)
            elif deaths >= self._max_engine_deaths:
                self._fail(
                    job_id,
                    JobError(
                        code="engine_crash",
                        message=(
                            f"the engine died {deaths} times while this request was in "
                            "flight; it was failed as poison so that other requests can run"
                        ),
                    ),
                )
            else:
                survivors.append(entry.request)
        self._in_flight.clear()
        self._sequences = 0
        try:
            self._engine.close()
        except Exception:  # a dead engine may fail to close; it is replaced either way
            log.debug("closing the dead engine failed", exc_info=True)
        self._engine = self._engine_factory()
        now = datetime.now(UTC)
        for request in survivors:
            self._admit(request, now)

    def _sample_stats(self) -> None:
        now = time.monotonic()
        if now - self._stats_at < STATS_EVERY_S:
            return
        self._stats_at = now
        try:
            usage = self._engine.kv_cache_usage()
        except Exception:  # stats are best effort; a dying engine is handled by step()
            log.debug("could not read engine stats", exc_info=True)
            return
        if usage is not None:
            self._metrics.kv_cache_usage.set(usage)
