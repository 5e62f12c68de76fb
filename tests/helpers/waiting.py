"""Waiting on something observable, instead of sleeping and hoping it happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def poll(check: Callable[[], T], *, timeout_s: float, interval_s: float = 0.05) -> T:
    """Call `check` until it returns something truthy or `timeout_s` passes; return what it
    returned last (falsy if the time ran out)."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()) and time.monotonic() < deadline:
        time.sleep(interval_s)
    return found


def wait_until(
    check: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.05
) -> T:
    """Call `check` until it returns something truthy, and return that; fail, saying
    `what` was awaited, if `timeout_s` passes first."""
    found = poll(check, timeout_s=timeout_s, interval_s=interval_s)
    if not found:
        raise AssertionError(f"not {what} after {timeout_s} s (last seen: {found!r})")
    return found
