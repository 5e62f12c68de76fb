"""How many jobs a worker holds at once: the first stage of admission, before the claim
in Postgres, served interactive-first (the whole story is in worker/admission.py)."""

from __future__ import annotations

import threading
import time


class CapacityGate:
    """A counting gate over held jobs, served interactive-first."""

    def __init__(self, limit: int, *, interactive_extra: int = 0) -> None:
        self._limit = limit
        self._interactive_extra = interactive_extra
        self._used = 0
        self._interactive_waiting = 0
        self._bulk_waiting = 0
        self._closed = False
        self._changed = threading.Condition()

    @property
    def bulk_waiting(self) -> int:
        """Batch chunks waiting for room (each holding its message meanwhile)."""
        return self._bulk_waiting

    def acquire(self, count: int, *, interactive: bool, timeout_s: float | None = None) -> bool:
        """Wait for room for `count` jobs; False if the gate closed (shutdown) meanwhile,
        or `timeout_s` passed first.

        A request larger than the whole gate gets in when the worker holds nothing.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._changed:
            if interactive:
                self._interactive_waiting += 1
            else:
                self._bulk_waiting += 1
            try:
                while not self._closed and not self._fits(count, interactive=interactive):
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
                if interactive:
                    self._interactive_waiting -= 1
                    self._changed.notify_all()
                else:
                    self._bulk_waiting -= 1

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
        if not interactive and self._interactive_waiting:
            return False
        limit = self._limit + (self._interactive_extra if interactive else 0)
        return self._used + count <= limit or self._used == 0
