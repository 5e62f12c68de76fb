"""The admission policy: which pending requests enter the engine, and when.

Requests wait here until the engine has room. An idle engine waits up to
`max_batch_delay_ms` for a micro-batch of `max_batch_size` to gather, so the first
prefill is shared; a busy engine takes whatever is pending at every step, so it never
waits for a batch to finish before admitting more. Interactive requests go first.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Sequence

from worker.engine import EngineRequest


class AdmissionQueue:
    """Pending requests, interactive before bulk, each in arrival order. Thread-safe."""

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
        self._interactive: deque[EngineRequest] = deque()
        self._bulk: deque[EngineRequest] = deque()
        self._oldest_at: float | None = None
        self._changed = threading.Condition()

    def __len__(self) -> int:
        return len(self._interactive) + len(self._bulk)

    def put(self, requests: Sequence[EngineRequest], *, interactive: bool) -> None:
        if not requests:
            return
        with self._changed:
            (self._interactive if interactive else self._bulk).extend(requests)
            if self._oldest_at is None:
                self._oldest_at = self._clock()
            self._changed.notify_all()

    def remove(self, job_ids: Collection[str]) -> list[EngineRequest]:
        """Take these jobs out if they are still pending; return those removed."""
        with self._changed:
            removed = [r for r in (*self._interactive, *self._bulk) if r.job_id in job_ids]
            if removed:
                self._interactive = deque(r for r in self._interactive if r.job_id not in job_ids)
                self._bulk = deque(r for r in self._bulk if r.job_id not in job_ids)
                if not self:
                    self._oldest_at = None
            return removed

    def drain(self) -> list[EngineRequest]:
        """Take everything pending (at shutdown)."""
        with self._changed:
            pending = [*self._interactive, *self._bulk]
            self._interactive.clear()
            self._bulk.clear()
            self._oldest_at = None
            return pending

    def wake(self) -> None:
        """Wake a waiting `take` (to stop, or to see an abort)."""
        with self._changed:
            self._changed.notify_all()

    def take(self, room: int, *, idle: bool, timeout_s: float) -> list[EngineRequest]:
        """Up to `min(room, max_batch_size)` requests.

        With `idle` set (the engine has nothing in flight) wait up to `timeout_s` for the
        first request, then up to `max_batch_delay_ms` from its arrival for a full
        micro-batch. Otherwise return at once with whatever is pending.
        """
        limit = min(room, self._max_batch_size)
        if limit <= 0:
            return []
        with self._changed:
            if idle:
                deadline = self._clock() + timeout_s
                while not self and self._changed.wait(max(0.0, deadline - self._clock())):
                    pass
                while self and len(self) < limit:
                    assert self._oldest_at is not None
                    left = self._oldest_at + self._max_batch_delay_s - self._clock()
                    if left <= 0 or not self._changed.wait(left):
                        break
            return self._pop(limit)

    def _pop(self, limit: int) -> list[EngineRequest]:
        taken: list[EngineRequest] = []
        for source in (self._interactive, self._bulk):
            while source and len(taken) < limit:
                taken.append(source.popleft())
        if not self:
            self._oldest_at = None
        return taken
