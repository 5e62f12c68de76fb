"""Time-ordered identifiers: sorting by id sorts by creation, which cursor pages rely on."""

from __future__ import annotations

import secrets
import threading
import time

_RANDOM_BITS = 80
_lock = threading.Lock()
_last_ms = 0
_last_random = 0


def new_id(prefix: str) -> str:
    """A 32-hex-digit id after `prefix`: 48 bits of milliseconds, then 80 random bits.

    Within one process ids strictly increase, even within one millisecond (the random
    part is then the previous one plus one), so a page boundary never skips a job.
    """
    global _last_ms, _last_random  # noqa: PLW0603 - the sequence is process-wide by design
    with _lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _last_ms:
            _last_ms, _last_random = now_ms, secrets.randbits(_RANDOM_BITS - 1)
        else:
            _last_random += 1
        return f"{prefix}{_last_ms:012x}{_last_random:020x}"
