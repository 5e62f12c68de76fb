"""How much work this worker committed in the last minute, for its heartbeat."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

WINDOW_S = 60


@dataclass(frozen=True)
class Throughput:
    """Work committed over the last minute."""

    jobs: int
    prompt_tokens: int
    generated_tokens: int


class RollingMinute:
    """Counts of committed work in the last minute. Thread-safe."""

    def __init__(self) -> None:
        self._events: deque[tuple[float, int, int, int]] = deque()
        self._lock = threading.Lock()

    def add(self, jobs: int, prompt_tokens: int, generated_tokens: int) -> None:
        with self._lock:
            self._events.append((time.monotonic(), jobs, prompt_tokens, generated_tokens))

    def total(self) -> Throughput:
        horizon = time.monotonic() - WINDOW_S
        with self._lock:
            while self._events and self._events[0][0] < horizon:
                self._events.popleft()
            events = list(self._events)
        return Throughput(
            jobs=sum(e[1] for e in events),
            prompt_tokens=sum(e[2] for e in events),
            generated_tokens=sum(e[3] for e in events),
        )
