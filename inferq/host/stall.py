"""Progress, not presence: a process that has room for work, while work waits for it,
and takes none for `stall_s` seconds is stuck, however alive it looks.

A heartbeat, `/metrics` or a Celery ping all answer from a worker whose consumer stopped
consuming. The watch reads, every few seconds, how much the process has taken so far (a
counter), whether it has room, and how much waits for it (what its peers took meanwhile
included). When the counter has not moved for `stall_s` while there was room and waiting
work at every reading, the process is stuck: it says why, tries to heal (consume again),
and if it is still stuck `stall_s` later, ends the process so that it is restarted."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from inferq.exceptions import InferqError
from inferq.host import supervision

log = logging.getLogger(__name__)

EXIT_STUCK = 72
# Readings per `stall_s` (and at least one every `MAX_EVERY_S`).
READINGS = 6
MAX_EVERY_S = 5.0


@dataclass(frozen=True)
class Progress:
    """One reading of a process's work."""

    taken: int  # work taken since the process started (messages, passes scheduled)
    room: bool  # it could take more now
    waiting: int  # work waiting that it would take
    # Of `waiting`, work its peers took instead of it since it last took any.
    taken_by_peers: int = 0


class StallWatch:
    """Reads a process's progress in a thread, and heals it or gives up when it is stuck."""

    def __init__(
        self,
        *,
        name: str,
        stall_s: float,
        read: Callable[[], Progress],
        heal: Callable[[], bool],
        give_up: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`heal` tries to get the process taking work again, True if it believes it did;
        `give_up` ends the process (it is called from the watch's thread)."""
        self._name = name
        self._stall_s = stall_s
        self._read = read
        self._heal = heal
        self._give_up = give_up
        self._clock = clock
        self._taken: int | None = None
        self._since: float | None = None  # room and waiting work, and nothing taken, since
        self._healed = False
        self.stuck: str | None = None  # why, while stuck
        self._stopping = threading.Event()
        self._thread = supervision.thread(self._run, name=f"{name}-stall-watch")

    @property
    def every_s(self) -> float:
        return min(self._stall_s / READINGS, MAX_EVERY_S)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()

    def check(self) -> None:
        """One reading (the thread calls this every `every_s`)."""
        try:
            reading = self._read()
        except InferqError as exc:  # Redis or Postgres away: nothing can be told
            log.debug("%s: no reading (%s)", self._name, exc)
            self._since = None
            return
        now = self._clock()
        moving = self._taken is not None and reading.taken != self._taken
        self._taken = reading.taken
        idle_or_full = not reading.room or reading.waiting == 0
        if self.stuck is not None and (moving or idle_or_full):
            log.warning("%s is %s again", self._name, "taking work" if moving else "not stuck")
            self.stuck, self._healed = None, False
        if idle_or_full:
            self._since = None
            return
        if moving:  # the bound counts from the last progress seen
            self._since = now
            return
        if self._since is None:
            self._since = now
            return
        if now - self._since < self._stall_s:
            return
        elsewhere = (
            f" ({reading.taken_by_peers} of them taken by its peers meanwhile)"
            if reading.taken_by_peers
            else ""
        )
        why = (
            f"{reading.waiting} waiting{elsewhere}, room to take them, and nothing taken "
            f"for {now - self._since:.0f} s"
        )
        self.stuck = why
        if not self._healed:
            log.error("%s is stuck: %s; healing", self._name, why)
            self._healed = True
            if self._heal():
                self._since = now  # a whole bound to show it works
                return
        log.critical("%s is stuck: %s, and healing did not help; giving up", self._name, why)
        self._give_up(why)

    def _run(self) -> None:
        while not self._stopping.wait(self.every_s):
            self.check()
