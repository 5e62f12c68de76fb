"""What this worker's engine does a second, measured as it runs: the rate batch estimates
count on (inferq/domain/estimates.py), reported with the heartbeat (worker/heartbeat.py).

The engine loop's thread reports each step (its time, the sequences in the engine,
whether prompts were filled in it) and each request that ends (its tokens and
`max_tokens`); the heartbeat's thread reads the rates. Steps with the engine at least
`FULL_SHARE` full give the rate a large batch gets (a step costs about the same however
full the engine on a GPU); steps with few sequences and no prompt give what a batch's
last lines cost beyond their tokens. Counts are kept in buckets of `BUCKET_S` over
`WINDOW_S`, so memory stays bounded however fast the engine steps."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# Long enough to even out waves of lines; short enough to follow a change in load.
WINDOW_S = 120.0
BUCKET_S = 10.0
SINGLE_JOB_WINDOW_S = 60.0
FULL_SHARE = 0.5
# Steps with at most this share of `max_num_seqs` (at least one sequence) give the step
# time of a batch's last lines.
LOW_SHARE = 0.1
# Less than this much time at full load in the window is not a measurement (on a GPU
# that is still dozens of steps of a full engine).
MIN_FULL_S = 2.0
# Fewer steps than this at low load is not a measurement.
MIN_LOW_STEPS = 20


@dataclass(frozen=True, kw_only=True)
class SpeedReading:
    """The engine's rates over the window (None where it saw nothing to measure)."""

    full_tokens_per_s: float | None
    """Tokens a second with the engine at least `FULL_SHARE` full (embeddings: prompt
    tokens a second while busy)."""
    busy_tokens_per_s: float | None
    """Tokens a second while it had any work."""
    output_fraction: float | None
    interactive_tokens_per_s: float
    tail_step_s: float | None
    """How much longer a step with few sequences in the engine takes than its tokens
    would at the full rate (seconds; 0 where it takes no longer)."""


@dataclass
class _Bucket:
    start: float
    full_s: float = 0.0
    full_tokens: int = 0
    busy_s: float = 0.0
    busy_tokens: int = 0
    completion_tokens: int = 0
    max_tokens: int = 0
    single_job_tokens: int = 0
    low_s: float = 0.0
    low_steps: int = 0
    low_tokens: int = 0


class Speedometer:
    """Thread-safe: the engine loop writes, the heartbeat reads."""

    def __init__(
        self,
        *,
        max_num_seqs: int,
        pooling: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._full_at = max(1, round(FULL_SHARE * max_num_seqs))
        self._low_at = max(1, round(LOW_SHARE * max_num_seqs))
        self._pooling = pooling
        self._clock = clock
        self._buckets: deque[_Bucket] = deque()
        self._lock = threading.Lock()

    def stepped(self, *, duration_s: float, sequences: int, admitted: bool = False) -> None:
        """The loop took `duration_s` for a step of `sequences` sequences (`admitted`: it
        took in requests before the step, whose prompts the step filled)."""
        if sequences <= 0:
            return
        with self._lock:
            bucket = self._bucket()
            bucket.busy_s += duration_s
            if self._pooling:  # embeddings count their prompts as they end
                return
            bucket.busy_tokens += sequences
            # A prompt filled makes a step far longer than its tokens: not a last line's.
            if sequences <= self._low_at and not admitted:
                bucket.low_s += duration_s
                bucket.low_steps += 1
                bucket.low_tokens += sequences
            if sequences >= self._full_at:
                bucket.full_s += duration_s
                bucket.full_tokens += sequences

    def finished(
        self, *, prompt_tokens: int, completion_tokens: int, max_tokens: int, single: bool
    ) -> None:
        """A request ended, having made `completion_tokens` of `max_tokens`."""
        with self._lock:
            bucket = self._bucket()
            if self._pooling:
                bucket.busy_tokens += prompt_tokens
                return
            bucket.completion_tokens += completion_tokens
            bucket.max_tokens += max_tokens
            if single:
                bucket.single_job_tokens += completion_tokens

    def reading(self) -> SpeedReading:
        now = self._clock()
        with self._lock:
            self._forget(now)
            buckets = list(self._buckets)
        full_s = sum(b.full_s for b in buckets)
        busy_s = sum(b.busy_s for b in buckets)
        max_tokens = sum(b.max_tokens for b in buckets)
        recent = [b for b in buckets if b.start >= now - SINGLE_JOB_WINDOW_S - BUCKET_S]
        if self._pooling:
            full = sum(b.busy_tokens for b in buckets) / busy_s if busy_s >= MIN_FULL_S else None
        else:
            full = sum(b.full_tokens for b in buckets) / full_s if full_s >= MIN_FULL_S else None
        busy = sum(b.busy_tokens for b in buckets) / busy_s if busy_s else None
        return SpeedReading(
            full_tokens_per_s=full,
            busy_tokens_per_s=busy,
            output_fraction=sum(b.completion_tokens for b in buckets) / max_tokens
            if max_tokens
            else None,
            interactive_tokens_per_s=sum(b.single_job_tokens for b in recent) / SINGLE_JOB_WINDOW_S,
            tail_step_s=_tail_step(buckets, full or busy),  # pooling steps count no low steps
        )

    def _bucket(self) -> _Bucket:
        now = self._clock()
        if not self._buckets or now - self._buckets[-1].start >= BUCKET_S:
            self._buckets.append(_Bucket(start=now))
            self._forget(now)
        return self._buckets[-1]

    def _forget(self, now: float) -> None:
        while self._buckets and self._buckets[0].start < now - WINDOW_S:
            self._buckets.popleft()


def _tail_step(buckets: list[_Bucket], tokens_per_s: float | None) -> float | None:
    """A low step's time less its tokens' time at `tokens_per_s`, on average."""
    steps = sum(b.low_steps for b in buckets)
    if steps < MIN_LOW_STEPS or not tokens_per_s:
        return None
    step_s = sum(b.low_s for b in buckets) / steps
    return max(0.0, step_s - sum(b.low_tokens for b in buckets) / steps / tokens_per_s)
