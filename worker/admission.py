"""The admission queue: claimed requests waiting for room in the engine.

`AdmissionQueue` holds what the feeder and the tasks claimed until the engine loop takes
it: single jobs first (by `priority`, then arrival), then batch lines in the order they
were claimed. `take` gives batch lines room up to `max_num_seqs` and single jobs up to
`interactive_seqs` more; an idle engine waits up to `max_batch_delay_ms` for
`max_batch_size` batch lines to gather (a single job never waits for that). Where this
sits among the three places single jobs go first: docs/how-it-works.md."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable, Collection, Sequence

from worker.engine.protocol import EngineRequest


class AdmissionQueue:
    """Pending requests in engine-priority order. Thread-safe."""

    def __init__(
        self,
        *,
        max_batch_size: int,
        max_batch_delay_ms: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_batch_size = max_batch_size
        self._max_batch_delay_s = max_batch_delay_ms / 1000
        self._clock = clock
        # (batch line?, priority, arrival, request): a heap, single jobs first.
        self._pending: list[tuple[bool, int, int, EngineRequest]] = []
        self._arrivals = itertools.count()
        self._single_jobs = 0
        self._oldest_at: float | None = None
        self._woken = False  # since the last `take`: the next one returns at once
        self._changed = threading.Condition()

    def __len__(self) -> int:
        return len(self._pending)

    def put(self, requests: Sequence[EngineRequest], *, single: bool) -> None:
        if not requests:
            return
        with self._changed:
            for request in requests:
                entry = (not single, request.priority, next(self._arrivals), request)
                heapq.heappush(self._pending, entry)
            if single:
                self._single_jobs += len(requests)
            if self._oldest_at is None:
                self._oldest_at = self._clock()
            self._changed.notify_all()

    def remove(self, job_ids: Collection[str]) -> list[EngineRequest]:
        """Take these jobs out if they are still pending; return those removed."""
        with self._changed:
            removed = [e for e in self._pending if e[3].job_id in job_ids]
            if removed:
                self._pending = [e for e in self._pending if e[3].job_id not in job_ids]
                heapq.heapify(self._pending)
                self._single_jobs -= sum(1 for e in removed if not e[0])
                if not self._pending:
                    self._oldest_at = None
            return [e[3] for e in sorted(removed)]

    def drain(self) -> list[EngineRequest]:
        """Take everything pending (at shutdown)."""
        with self._changed:
            pending = [e[3] for e in sorted(self._pending)]
            self._pending.clear()
            self._single_jobs = 0
            self._oldest_at = None
            return pending

    def wake(self) -> None:
        """Make a waiting `take`, or the next one, return (to stop, or to see an abort)."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    def take(
        self, room: int, *, single_room: int | None = None, idle: bool, timeout_s: float
    ) -> list[EngineRequest]:
        """Batch lines while fewer than `room` are taken, single jobs while fewer than
        `single_room` (default: `room`): what a step computes is the engine's own
        scheduler's to bound (its token budget), so nothing ready is held back here.

        With `idle` set (the engine has nothing in flight) wait up to `timeout_s`, or until
        `wake`, for the first request, then, unless a single job is pending, up to
        `max_batch_delay_ms` from its arrival for `max_batch_size` of them. Otherwise
        return at once.
        """
        single_room = room if single_room is None else single_room
        if max(room, single_room) <= 0:
            return []
        gather = min(room, self._max_batch_size)
        with self._changed:
            if idle:
                deadline = self._clock() + timeout_s
                while not self and not self._woken:
                    if not self._changed.wait(max(0.0, deadline - self._clock())):
                        break
                while self and not self._single_jobs and len(self) < gather:
                    assert self._oldest_at is not None
                    left = self._oldest_at + self._max_batch_delay_s - self._clock()
                    if left <= 0 or not self._changed.wait(left):
                        break
            self._woken = False
            return self._pop(room, single_room)

    def _pop(self, room: int, single_room: int) -> list[EngineRequest]:
        taken: list[EngineRequest] = []
        while self._pending:
            bulk, _, _, request = self._pending[0]
            if len(taken) >= (room if bulk else single_room):
                break
            heapq.heappop(self._pending)
            self._single_jobs -= not bulk
            taken.append(request)
        if not self._pending:
            self._oldest_at = None
        return taken
