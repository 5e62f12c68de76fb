"""The feeder: the one door batch lines take into a worker.

Whenever the capacity gate has room for half a micro-batch or more, the feeder claims as
many batch lines of its queue in Postgres as there is room for, in the order work is
shared between tenants (inferq/store/batch_claims.py), and hands them to the admission
queue. Nobody waits on them: their results are committed by the writer, and their room
given back.

Postgres holds the lines, so nothing a feeder needs lives in Redis: a batch's Celery
message only wakes it sooner (`wake`), and it looks again every `poll_s` regardless, so a
message lost with Redis costs a moment, not a line.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from inferq.domain.jobs import ClaimedJob
from inferq.exceptions import StoreUnavailable
from inferq.host import supervision
from worker.capacity import CapacityGate
from worker.store import WorkerStore

log = logging.getLogger(__name__)

# How often an idle feeder looks for lines no message told it of.
POLL_S = 1.0
MAX_BACKOFF_S = 5.0
# A claim takes whatever room the gate has (it never holds more than a full engine and a
# micro-batch): fewer, larger claims keep up with an engine whose short lines end by the
# dozen every step.
ALL_THE_ROOM = 1 << 30
# Claims in a row that may fail of an unexpected error before the feeder gives up (its
# thread dies, so the worker exits to be restarted: inferq/host/supervision.py). One is
# ridden out; one that fails every time would leave the lines waiting forever.
MAX_FAILED_CLAIMS = 5


class BatchFeeder:
    """A thread that claims batch lines while the worker has room for them."""

    def __init__(
        self,
        *,
        store: WorkerStore,
        gate: CapacityGate,
        queue: str,
        worker_name: str,
        lease_s: int,
        micro_batch: int,
        on_claimed: Callable[[Sequence[ClaimedJob]], object],
        poll_s: float = POLL_S,
    ) -> None:
        """A claim takes all the room there is, but waits for room for half a
        `micro_batch`, so claims stay few while the admission queue still holds lines."""
        self._store = store
        self._gate = gate
        self._queue = queue
        self._worker_name = worker_name
        self._lease_s = lease_s
        self._least = max(1, micro_batch // 2)
        self._on_claimed = on_claimed
        self._poll_s = poll_s
        self._woken = threading.Event()
        self._stopping = threading.Event()
        self._thread = supervision.thread(self._run, name="batch-feeder")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._woken.set()
        self._thread.join(10)

    def wake(self) -> None:
        """Lines may be waiting: look now, not at the next poll."""
        self._woken.set()

    def _run(self) -> None:
        backoff = 0.1
        failed = 0
        while not self._stopping.is_set():
            room = self._gate.reserve(ALL_THE_ROOM, least=self._least)
            if not room:
                self._gate.wait_for_room(self._least, timeout_s=self._poll_s)
                continue
            self._woken.clear()
            try:
                claimed = self._store.claim_batch_lines(
                    queue=self._queue,
                    worker=self._worker_name,
                    lease_s=self._lease_s,
                    limit=room,
                )
            except Exception as exc:
                # The room comes back (kept, it would be lost for the life of the process),
                # and the claim is tried again: the lines wait in Postgres meanwhile.
                self._gate.release(room)
                if isinstance(exc, StoreUnavailable):
                    log.warning("cannot claim batch lines yet (%s); retrying", exc)
                else:
                    failed += 1
                    if failed >= MAX_FAILED_CLAIMS:
                        raise
                    log.exception("a claim of batch lines failed; retrying")
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                continue
            backoff, failed = 0.1, 0
            self._gate.release(room - len(claimed))
            if claimed:
                self._on_claimed(claimed)
            if len(claimed) < room:
                # Nothing more waiting: until a message or the poll says otherwise.
                self._woken.wait(self._poll_s)
