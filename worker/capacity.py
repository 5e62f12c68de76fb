"""How many jobs a worker holds at once: the count every claim goes through, single jobs
first (the whole path is told in worker/admission.py).

A single job's task waits here for room, in arrival order, then claims its job. Batch
lines are taken by the feeder (worker/feeder.py), which asks for room only when it has
some to fill and never waits in line: while a single job waits, batch lines get no room,
and single jobs may use `interactive_extra` places past the limit, since the engine keeps
slots for them that a gate full of batch lines must not keep them out of.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque


class CapacityGate:
    """A counting gate over held jobs: single jobs in arrival order, then batch lines."""

    def __init__(self, limit: int, *, interactive_extra: int = 0) -> None:
        self._limit = limit
        self._interactive_extra = interactive_extra
        self._used = 0
        # The single jobs' tasks waiting, oldest first: only the oldest may get in.
        self._arrivals = itertools.count()
        self._waiting: deque[int] = deque()
        self._closed = False
        self._changed = threading.Condition()

    @property
    def waiting(self) -> int:
        """Single jobs' tasks waiting for room."""
        return len(self._waiting)

    @property
    def has_room(self) -> bool:
        """Another job would get in now: the gate is open (a draining worker's is not),
        has room, and nobody waits for it."""
        return not self._closed and self._used < self._limit and not self._waiting

    def acquire(self, count: int, *, timeout_s: float | None = None) -> bool:
        """Wait for room for a single job's `count` jobs, after every one that came
        before; False if the gate closed (shutdown) meanwhile, or `timeout_s` passed first.

        A request larger than the whole gate gets in when the worker holds nothing.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            turn = next(self._arrivals)
            self._waiting.append(turn)
            try:
                while not self._closed and not (self._waiting[0] == turn and self._fits(count)):
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and (left <= 0 or not self._changed.wait(left)):
                        return False
                    if left is None:
                        self._changed.wait()
                if self._closed:
                    return False
                self._used += count
                return True
            finally:
                self._waiting.remove(turn)
                # The next in line, or batch lines held back by this one, may get in now.
                self._changed.notify_all()

    def reserve(self, most: int, *, least: int = 1) -> int:
        """Room for batch lines, taken now: up to `most`, or none if less than `least`
        (at most the whole gate) is free, a single job waits, or the gate is closed."""
        with self._changed:
            free = self._free()
            if free < self._needed(least):
                return 0
            taken = min(most, free)
            self._used += taken
            return taken

    def wait_for_room(self, least: int, *, timeout_s: float) -> bool:
        """Wait until `least` places are free for batch lines (False: `timeout_s` passed,
        or the gate closed)."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self._free() < self._needed(least):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
            return True

    def release(self, count: int) -> None:
        with self._changed:
            self._used = max(0, self._used - count)
            self._changed.notify_all()

    def close(self) -> None:
        """Turn every waiter away (at shutdown)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _needed(self, least: int) -> int:
        """`least`, but never more than the whole gate (which would never be free)."""
        return max(1, min(least, self._limit))

    def _free(self) -> int:
        """Places free for batch lines."""
        if self._closed or self._waiting:
            return 0
        return max(0, self._limit - self._used)

    def _fits(self, count: int) -> bool:
        limit = self._limit + self._interactive_extra
        return self._used + count <= limit or self._used == 0
