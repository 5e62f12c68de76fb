"""The feeder: the thread that claims work for a worker, through its door (worker/door.py).

Each pass claims, in one transaction: first the single jobs asked for that did not fit
when asked (oldest message first, once they fit); then, while no single job is asked
for and there is room for a micro-batch, batch lines of its queues, no more than
its share of those left between its peers, in the order work is shared between tenants
(inferq/store/batch_claims.py). What it claims it hands to the GPU worker
(`Admits.admit`), for the admission queue. Postgres keeps the lines: an announcement only
wakes it sooner, and it looks again every `poll_s` regardless."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from inferq.domain.fair_share import FleetShare
from inferq.domain.jobs import ClaimedJob
from inferq.exceptions import StoreUnavailable
from inferq.host import supervision
from worker.door import Asked, Door
from worker.store import WorkerStore

log = logging.getLogger(__name__)

# How often an idle feeder looks for lines no message told it of.
POLL_S = 1.0
MAX_BACKOFF_S = 5.0
# A claim of lines takes whatever room the door has (a worker never holds more than a
# full engine and a micro-batch): fewer, larger claims keep up with an engine whose short
# lines end by the dozen every step.
ALL_THE_ROOM = 1 << 30
# Claims in a row that may fail of an unexpected error before the feeder gives up (its
# thread dies, so the worker exits to be restarted: inferq/host/supervision.py). One is
# ridden out; one that fails every time would leave the work waiting forever.
MAX_FAILED_CLAIMS = 5


class Admits(Protocol):
    """What the feeder hands claimed jobs to: the GPU worker (worker/gpu_worker.py)."""

    def admit(self, claimed: Sequence[ClaimedJob], *, single: bool) -> None:
        """Jobs just claimed and held; `single`: single jobs, else batch lines."""


class Feeder(supervision.SupervisedThread):
    """A thread that claims single jobs asked for, then batch lines, while there is room."""

    thread_name = "feeder"
    stop_timeout_s = 10

    def __init__(
        self,
        *,
        store: WorkerStore,
        door: Door,
        batch_queue: str | None,
        worker_name: str,
        lease_s: int,
        micro_batch: int,
        admits: Admits,
        peers: Callable[[], int] = lambda: 1,
        poll_s: float = POLL_S,
    ) -> None:
        """`batch_queue`: whose lines to claim (None: single jobs only). A claim of lines
        takes all the room there is, up to this worker's share of the lines left between
        its `peers` (the workers on the queue, itself included), but waits for room for
        a `micro_batch`, so claims stay few while the admission queue still holds lines
        (the door holds two micro-batches beyond a full engine for that). `admits` is
        handed what was claimed."""
        self._store = store
        self._door = door
        self._batch_queue = batch_queue
        self._worker_name = worker_name
        self._lease_s = lease_s
        self._micro_batch = micro_batch
        self._least = max(1, micro_batch)
        self._admits = admits
        self._peers = peers
        self._poll_s = poll_s
        self._backoff = 0.1
        self._failed = 0
        super().__init__()

    def _wake(self) -> None:
        self._door.wake()

    def _run(self) -> None:
        # Whether batch lines may be waiting: at start, after a wake-up, every `poll_s`,
        # and while claims fill all the room. Otherwise claims of single jobs are not
        # followed by a look for lines that are not there.
        lines_waiting = self._batch_queue is not None
        look_at = 0.0
        while not self._stopping.is_set():
            if taken := self._door.take_asked():
                self._claim_asked(taken)
                continue
            if self._door.woken() or time.monotonic() >= look_at:
                lines_waiting = self._batch_queue is not None
                look_at = time.monotonic() + self._poll_s
            if not lines_waiting or self._batch_queue is None:
                self._door.wait(max(0.0, look_at - time.monotonic()))
                continue
            # An idle engine starts on a micro-batch while the rest of the room is claimed.
            most = self._micro_batch if not len(self._door) else ALL_THE_ROOM
            room = self._door.reserve(most, least=self._least)
            if not room:
                self._door.wait(self._poll_s, room_for=self._least)
                continue
            got = self._claim_lines(self._batch_queue, room)
            # All the room filled: more may wait. Less (or a failed claim, None, which
            # waited its back-off): until a message, a single job or the poll.
            lines_waiting = got is None or got >= room

    def claim_asked(self) -> None:
        """Claim the single jobs asked for that fit, in the calling thread (a task's, as
        it asks), so that no message wakes the feeder's thread. A claim that fails here
        is put back, for the feeder's thread to try again with its back-off."""
        if not (taken := self._door.take_asked()):
            return
        ids = [job_id for asked in taken for job_id in asked.tickets]
        try:
            claimed = self._store.claim_jobs(ids, worker=self._worker_name, lease_s=self._lease_s)
        except Exception as exc:
            self._door.put_back(taken)
            if isinstance(exc, StoreUnavailable):
                log.debug("cannot claim %d jobs yet (%s); the feeder tries again", len(ids), exc)
            else:
                log.warning(
                    "a claim of %d jobs failed; the feeder tries again", len(ids), exc_info=True
                )
            return
        self._hold_asked(claimed, taken)

    def _claim_asked(self, taken: list[Asked]) -> None:
        ids = [job_id for asked in taken for job_id in asked.tickets]
        try:
            claimed = self._store.claim_jobs(ids, worker=self._worker_name, lease_s=self._lease_s)
        except Exception as exc:
            # Their messages are held meanwhile, and the jobs still queued.
            self._door.put_back(taken)
            if not self._ride_out(exc, f"{len(ids)} jobs"):
                raise
            return
        self._hold_asked(claimed, taken)

    def _hold_asked(self, claimed: Sequence[ClaimedJob], taken: list[Asked]) -> None:
        self._claimed()
        to_run, _ = self._door.hold(claimed, taken=taken)
        if to_run:
            self._admits.admit(to_run, single=True)

    def _claim_lines(self, queue: str, room: int) -> int | None:
        """Claim up to `room` lines; how many it got (None if the claim failed)."""
        try:
            claimed = self._store.claim_batch_lines(
                queue=queue,
                worker=self._worker_name,
                lease_s=self._lease_s,
                limit=room,
                fleet=FleetShare(workers=self._peers(), held=self._door.lines_held()),
            )
        except Exception as exc:
            # The room comes back (kept, it would be lost for the life of the process),
            # and the claim is tried again: the lines wait in Postgres meanwhile.
            self._door.unreserve(room)
            if not self._ride_out(exc, "batch lines"):
                raise
            return None
        self._claimed()
        to_run, _ = self._door.hold(claimed, reserved=room)
        if to_run:
            self._admits.admit(to_run, single=False)
        return len(claimed)

    def _claimed(self) -> None:
        self._backoff, self._failed = 0.1, 0

    def _ride_out(self, exc: Exception, what: str) -> bool:
        """After a failed claim: wait a while to try again (True), or give up (False)."""
        if isinstance(exc, StoreUnavailable):
            log.warning("cannot claim %s yet (%s); retrying", what, exc)
        else:
            self._failed += 1
            if self._failed >= MAX_FAILED_CLAIMS:
                return False
            log.exception("a claim of %s failed; retrying", what)
        self._stopping.wait(self._backoff)
        self._backoff = min(self._backoff * 2, MAX_BACKOFF_S)
        return True
