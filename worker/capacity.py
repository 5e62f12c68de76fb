"""How many jobs a worker holds at once: the first stage of admission, before the claim
in Postgres, served interactive-first and, within each kind, first come, first served
(the whole story is in worker/admission.py).

First come, first served matters: a worker holds a message per thread (a hundred or so)
while they wait here, so most of a queued batch can be waiting at once. Woken all together
and left to the scheduler, waiters got in at random, and a batch submitted later took
the engine from one submitted before it (a 1,500-line batch ended after most of the
20,000-line batch behind it, in bench.estimates), where batch lines are meant to run in
the order they were queued, which is what batch estimates and a followed batch (lines sent
in input order) count on.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque


class CapacityGate:
    """A counting gate over held jobs, served interactive-first, then in arrival order."""

    def __init__(self, limit: int, *, interactive_extra: int = 0) -> None:
        self._limit = limit
        self._interactive_extra = interactive_extra
        self._used = 0
        # Tickets of the waiters, oldest first: only the oldest of a kind may get in.
        self._tickets = itertools.count()
        self._interactive: deque[int] = deque()
        self._bulk: deque[int] = deque()
        self._closed = False
        self._changed = threading.Condition()

    @property
    def bulk_waiting(self) -> int:
        """Batch chunks waiting for room (each holding its message meanwhile)."""
        return len(self._bulk)

    @property
    def has_room(self) -> bool:
        """Another job would get in now: the gate is open (a draining worker's is not),
        has room, and nobody waits for it."""
        waiting = self._interactive or self._bulk
        return not self._closed and self._used < self._limit and not waiting

    def acquire(self, count: int, *, interactive: bool, timeout_s: float | None = None) -> bool:
        """Wait for room for `count` jobs, after every waiter of its kind that came
        before; False if the gate closed (shutdown) meanwhile, or `timeout_s` passed first.

        A request larger than the whole gate gets in when the worker holds nothing.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            line = self._interactive if interactive else self._bulk
            ticket = next(self._tickets)
            line.append(ticket)
            try:
                while not self._closed and not (
                    line[0] == ticket and self._fits(count, interactive=interactive)
                ):
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
                line.remove(ticket)
                # The next in line, or bulk work held back by this one, may get in now.
                self._changed.notify_all()

    def release(self, count: int) -> None:
        with self._changed:
            self._used = max(0, self._used - count)
            self._changed.notify_all()

    def close(self) -> None:
        """Turn every waiter away (at shutdown)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _fits(self, count: int, *, interactive: bool) -> bool:
        if not interactive and self._interactive:
            return False
        limit = self._limit + (self._interactive_extra if interactive else 0)
        return self._used + count <= limit or self._used == 0
