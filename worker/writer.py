"""The result writer: finished outcomes go to Postgres in bulk, one transaction a flush.

Only after the commit does it hand them on (`Ends.committed`): a message is acknowledged
only once its jobs' outcomes are stored. If the database is down the writer keeps the
outcomes and retries; an outcome that cannot be stored at all is written alone as a
failure, so one bad result never blocks the others. A single job's result is flushed at
once after a quiet spell, and `flush_ms` after the last write under load; batch lines'
wait up to `bulk_wait_s` (or until `BULK_GATHER` of them) unless a single job's result
takes them along or nothing more is on its way (`Ends.more_coming`)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

from inferq.domain.jobs import JobError, JobOutcome
from inferq.exceptions import StoreUnavailable
from inferq.host import supervision
from worker.store import WorkerStore

log = logging.getLogger(__name__)

MAX_FLUSH = 512
MAX_BACKOFF_S = 5.0
BULK_WAIT_S = 1.0
# Few enough that the jobs they hold back from the door are not missed.
BULK_GATHER = 32


class Ends(Protocol):
    """What the writer hands committed outcomes to: the GPU worker (worker/gpu_worker.py)."""

    def committed(
        self, outcomes: Sequence[JobOutcome], written: Sequence[str], *, finished_at: datetime
    ) -> None:
        """`outcomes` were written; `written` are the jobs whose outcome was stored (one
        cancelled or taken over meanwhile is not), each as finished at `finished_at`."""

    def more_coming(self) -> bool:
        """Whether outcomes are on their way that have not been put (jobs held and not
        finished): batch lines wait for company only while some are."""


class ResultWriter(supervision.SupervisedThread):
    """Collects outcomes from the engine loop and writes them in bulk, in its own thread;
    `stop` writes everything already put, then ends it."""

    thread_name = "result-writer"
    stop_timeout_s = 30

    def __init__(
        self,
        *,
        store: WorkerStore,
        flush_ms: int,
        ends: Ends,
        bulk_wait_s: float = BULK_WAIT_S,
    ) -> None:
        self._store = store
        self._ends = ends
        self._flush_s = flush_ms / 1000
        self._bulk_wait_s = bulk_wait_s
        self._queue: queue.SimpleQueue[JobOutcome | None] = queue.SimpleQueue()
        self._nudge = threading.Event()  # set by a put that gives a reason to write now
        self._gathered = 0  # taken for the write being gathered (the writer's; others read it)
        self._pending = 0  # put and not yet committed
        self._pending_lock = threading.Lock()
        super().__init__()

    @property
    def pending(self) -> int:
        """Outcomes put and not yet committed (nor handed on)."""
        return self._pending

    def put(self, outcome: JobOutcome) -> None:
        with self._pending_lock:
            self._pending += 1
        self._queue.put(outcome)
        # Batch lines wait for company without the writer waking at each step's few: only
        # a reason to write sooner wakes it.
        gathered = self._gathered + self._queue.qsize()
        if not outcome.bulk or gathered >= BULK_GATHER or not self._ends.more_coming():
            self._nudge.set()

    def _wake(self) -> None:
        self._queue.put(None)  # after everything put before it
        self._nudge.set()

    def _run(self) -> None:
        stopping = False
        last_write = 0.0
        while not stopping:
            batch, stopping = self._gather(not_before=last_write + self._flush_s)
            if batch:
                self._write(batch)
                last_write = time.monotonic()

    def _gather(self, *, not_before: float) -> tuple[list[JobOutcome], bool]:
        """The next results to write. Under load writes are `flush_ms` apart, each carrying
        what finished meanwhile; a single job's result that ends a quiet spell goes at once,
        batch lines wait for company (see the module's doc)."""
        self._gathered = 0
        first = self._queue.get()
        if first is None:
            return [], True
        batch = [first]
        urgent = max(time.monotonic(), not_before)
        deadline = urgent if not first.bulk else max(urgent, time.monotonic() + self._bulk_wait_s)
        while True:
            self._nudge.clear()  # before looking: a put after the look wakes the wait
            while len(batch) < (most := MAX_FLUSH if deadline <= urgent else BULK_GATHER):
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    return batch, True
                batch.append(item)
                if not item.bulk:
                    deadline = min(deadline, urgent)
            self._gathered = len(batch)
            if len(batch) >= most:
                return batch, False
            if deadline > urgent and not self._ends.more_coming():
                return batch, False
            left = deadline - time.monotonic()
            if left <= 0:
                return batch, False
            self._nudge.wait(left)

    def _write(self, batch: list[JobOutcome]) -> None:
        backoff = 0.1
        while True:
            now = datetime.now(UTC)
            try:
                written = self._write_batch(batch, now)
            except StoreUnavailable as exc:
                log.warning("cannot write %d results yet (%s); retrying", len(batch), exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            break
        try:
            self._ends.committed(batch, written, finished_at=now)
        finally:
            with self._pending_lock:
                self._pending -= len(batch)

    def _write_batch(self, batch: list[JobOutcome], now: datetime) -> list[str]:
        try:
            return self._store.finish_jobs(batch, now=now)
        except StoreUnavailable:
            raise
        except Exception:
            log.exception("writing %d results failed; writing them one by one", len(batch))
            return self._write_singly(batch, now)

    def _write_singly(self, batch: list[JobOutcome], now: datetime) -> list[str]:
        written: list[str] = []
        for outcome in batch:
            try:
                written += self._store.finish_jobs([outcome], now=now)
            except StoreUnavailable:
                raise
            except Exception as exc:
                log.exception(
                    "the result of %s cannot be stored",
                    outcome.job_id,
                    extra={"job_id": outcome.job_id},
                )
                failure = JobOutcome(
                    job_id=outcome.job_id,
                    error=JobError(
                        code="result_not_stored",
                        message=f"the result could not be stored: {exc}",
                    ),
                    started_at=outcome.started_at,
                )
                written += self._store.finish_jobs([failure], now=now)
        return written
