"""The door into the engine: the one count of the jobs a worker holds, and the order in
which more come in.

A single job's task asks for its jobs (`ask`) and gets a `Ticket` each; what fits is
claimed at once in the task's thread (`Feeder.claim_asked`), the rest waits here, oldest
message first, for the feeder. A job is held from its claim until its outcome is
committed, it is cancelled or it is given back; then its ticket ends, which tells whoever
asked. Two messages carrying the same job share one ticket. Room: `limit` jobs held,
claims under way counted in; batch lines get room only while no single job is asked for,
single jobs `single_extra` places more, and a message larger than the whole limit
gets in when nothing is held."""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from inferq.domain.jobs import ClaimedJob

# How many recent cancels a worker remembers; a claim that raced one ends within
# milliseconds, so this only needs to outlast a burst of cancels.
REMEMBERED_CANCELS = 10_000


# Guards the hand-over of a ticket's callbacks between `when_ended` and `end`.
_ENDING = threading.Lock()


class Ticket:
    """A message's handle on one job: set when the job has ended here, one way or
    another; whoever asked for it hears of that through `when_ended`."""

    __slots__ = ("_callbacks", "attempts", "batch_id", "created_at", "ended", "returned")

    def __init__(self) -> None:
        # Set under `_ENDING`; nobody waits on it (a waiter takes a callback), so a plain
        # flag: a ticket is made for every job claimed, and an Event costs a lock of its own.
        self.ended = False
        self.returned = False
        self.created_at: datetime | None = None
        self.batch_id: str | None = None
        self.attempts = 0  # as the claim that holds the job counted them
        self._callbacks: list[Callable[[Ticket], None]] = []

    def when_ended(self, callback: Callable[[Ticket], None]) -> None:
        """Call `callback(self)` once the job has ended: now if it has, else from the
        thread that ends it."""
        with _ENDING:
            if not self.ended:
                self._callbacks.append(callback)
                return
        callback(self)

    def end(self, *, returned: bool) -> None:
        """The job has ended here; `returned`: it went back to the queue."""
        self.returned = returned
        with _ENDING:
            self.ended = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)


@dataclass
class Asked:
    """A message's jobs, asked for and not claimed yet."""

    tickets: dict[str, Ticket] = field(default_factory=dict)


class Door:
    """Held jobs by id, single jobs asked for, and the room between. Thread-safe."""

    def __init__(self, limit: int, *, single_extra: int = 0) -> None:
        self._limit = limit
        self._single_extra = single_extra
        self._held: dict[str, Ticket] = {}
        self._asked: deque[Asked] = deque()
        # Room taken by claims under way: counted as held until they return.
        self._claiming = 0
        # Jobs cancelled lately, held or not: a job claimed just before its cancel
        # committed may be held after the cancel was heard (see `cancel`).
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._closed = False
        self._woken = False
        # Whether the feeder waits (`wait`), and the room it waits for batch lines (None:
        # it does not): room freed wakes it only once what it waits for fits. A wake-up
        # costs the waker a system call and the other thread a switch (tens of
        # microseconds, more on a virtual machine); most room freed is not enough for
        # anyone yet, and most messages are claimed by the thread that asks.
        self._feeder_waits = False
        self._room_for_lines: int | None = None
        self._changed = threading.Condition()

    def __len__(self) -> int:
        return len(self._held)

    @property
    def has_room(self) -> bool:
        """Another message's job would be claimed now: the door is open (a draining
        worker's is not), has room, and nothing asked for waits."""
        with self._changed:
            return not self._closed and self._used < self._limit and not self._asked

    def held_ids(self) -> list[str]:
        with self._changed:
            return list(self._held)

    def asked_ids(self) -> list[str]:
        """Jobs asked for and not claimed yet (still queued, their messages here)."""
        with self._changed:
            return list(self._pending())

    def not_held(self, job_ids: Sequence[str]) -> list[str]:
        """Those of `job_ids` not held here."""
        with self._changed:
            return [j for j in job_ids if j not in self._held]

    def lines_held(self) -> dict[str, int]:
        """Batch lines held here, counted by batch."""
        with self._changed:
            return dict(Counter(t.batch_id for t in self._held.values() if t.batch_id))

    def batch_ids(self) -> set[str | None]:
        """The batches whose lines are held here (None for single jobs)."""
        with self._changed:
            return {t.batch_id for t in self._held.values()}

    # A task's side.

    def ask(self, job_ids: Sequence[str]) -> list[Ticket]:
        """Tickets for a message's jobs: those held or asked for already (a redelivery)
        share theirs; the others wait to be claimed (`take_asked`), by the asker if they
        fit, else by the feeder once room is freed. A closed door ends them at once, as
        returned."""
        with self._changed:
            pending = self._pending()
            fresh = Asked()
            tickets = []
            for job_id in job_ids:
                ticket = self._held.get(job_id) or pending.get(job_id)
                if ticket is None:
                    ticket = fresh.tickets.setdefault(job_id, Ticket())
                tickets.append(ticket)
            if fresh.tickets:
                if self._closed:
                    for ticket in fresh.tickets.values():
                        ticket.end(returned=True)
                else:
                    self._asked.append(fresh)
            return tickets

    # The claimers' side: the feeder, and a task that claims what it asked for.

    def take_asked(self) -> list[Asked]:
        """The messages asked for that fit now, oldest first, their room taken."""
        with self._changed:
            taken: list[Asked] = []
            while self._asked and self._fits(len(self._asked[0].tickets)):
                asked = self._asked.popleft()
                self._claiming += len(asked.tickets)
                taken.append(asked)
            return taken

    def put_back(self, taken: Sequence[Asked]) -> None:
        """A claim of these failed: first in line again, their room back."""
        with self._changed:
            self._claiming -= sum(len(asked.tickets) for asked in taken)
            if self._closed:
                for asked in taken:
                    for ticket in asked.tickets.values():
                        ticket.end(returned=True)
            else:
                self._asked.extendleft(reversed(taken))
            self._changed.notify_all()

    def reserve(self, most: int, *, least: int = 1) -> int:
        """Room for batch lines, taken now: up to `most`, or none if less than `least`
        (at most the whole limit) is free, a single job is asked for, or the door is
        closed."""
        with self._changed:
            free = self._free()
            if free < self._needed(least):
                return 0
            taken = min(most, free)
            self._claiming += taken
            return taken

    def unreserve(self, count: int) -> None:
        """Room reserved and not used."""
        with self._changed:
            self._claiming -= count
            self._wake_for_room()

    def hold(
        self, claimed: Sequence[ClaimedJob], *, taken: Sequence[Asked] = (), reserved: int = 0
    ) -> tuple[list[ClaimedJob], list[str]]:
        """Hold the jobs a claim got, with the room it took (`taken` messages, or
        `reserved` places), which is given back where unused. Tickets of jobs asked for
        and not claimed (held elsewhere, cancelled or ended) end now.

        Returns the jobs to run, and those cancelled before they were held here (they
        are not held: see `cancel`)."""
        with self._changed:
            self._claiming -= reserved + sum(len(asked.tickets) for asked in taken)
            tickets = {j: t for asked in taken for j, t in asked.tickets.items()}
            to_run: list[ClaimedJob] = []
            cancelled: list[str] = []
            for job in claimed:
                if job.id in self._cancelled:
                    del self._cancelled[job.id]
                    cancelled.append(job.id)
                    continue
                ticket = tickets.pop(job.id, None) or Ticket()
                ticket.created_at, ticket.batch_id = job.created_at, job.batch_id
                ticket.attempts = job.attempts
                self._held.setdefault(job.id, ticket)
                to_run.append(job)
            for job_id, ticket in tickets.items():
                # Not claimed: a ticket already held (the same job in two messages
                # claimed at once) stays; the others' tasks may return.
                if self._held.get(job_id) is not ticket:
                    ticket.end(returned=False)
            self._wake_for_room()
            return to_run, cancelled

    def wake(self) -> None:
        """Batch lines may be waiting: the feeder looks now, not at its next poll."""
        with self._changed:
            self._woken = True
            self._changed.notify_all()

    def wait(self, timeout_s: float, *, room_for: int | None = None) -> bool:
        """Wait until a message asked for fits, `wake` is called, or (with `room_for`)
        that many places are free for batch lines; False if `timeout_s` passed first."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while not (
                self._woken
                or (self._asked and self._fits(len(self._asked[0].tickets)))
                or (room_for is not None and self._free() >= self._needed(room_for))
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._feeder_waits = True
                self._room_for_lines = None if room_for is None else self._needed(room_for)
                try:
                    self._changed.wait(left)
                finally:
                    self._feeder_waits, self._room_for_lines = False, None
            return True

    def woken(self) -> bool:
        """Whether `wake` was called since this was last asked."""
        with self._changed:
            woken, self._woken = self._woken, False
            return woken

    # Jobs ending.

    def let_go(self, job_ids: Sequence[str], *, returned: bool = False) -> list[Ticket]:
        """Stop holding these jobs (ended, given back or cancelled) and end their tickets;
        returns those that were held."""
        with self._changed:
            tickets = [t for t in (self._held.pop(j, None) for j in job_ids) if t is not None]
            if tickets:
                self._wake_for_room()
        for ticket in tickets:
            ticket.end(returned=returned)
        return tickets

    def tickets(self, job_ids: Sequence[str]) -> dict[str, Ticket]:
        """The tickets of those of `job_ids` held here, by job id."""
        with self._changed:
            return {j: self._held[j] for j in job_ids if j in self._held}

    def cancel(self, job_ids: Sequence[str]) -> list[str]:
        """Those of `job_ids` held here; the others are remembered as cancelled, so that
        a claim that raced the cancel does not hold them (`hold`)."""
        with self._changed:
            held = [j for j in job_ids if j in self._held]
            for job_id in job_ids:
                if job_id not in self._held:
                    self._cancelled[job_id] = None
            while len(self._cancelled) > REMEMBERED_CANCELS:
                self._cancelled.popitem(last=False)
            return held

    def close(self) -> list[str]:
        """Turn every message asked for away (at shutdown): their tickets end as
        returned, their jobs still queued. Returns those jobs."""
        with self._changed:
            self._closed = True
            turned = self._pending()
            self._asked.clear()
            self._changed.notify_all()
        for ticket in turned.values():
            ticket.end(returned=True)
        return list(turned)

    def _wake_for_room(self) -> None:
        """Room was freed: wake the feeder if it waits for it, and what it waits for fits
        now: the oldest message asked for, or batch lines (lock held)."""
        if not self._feeder_waits:
            return
        if self._asked:
            wanted = self._fits(len(self._asked[0].tickets))
        else:
            wanted = self._room_for_lines is not None and self._free() >= self._room_for_lines
        if wanted:
            self._changed.notify_all()

    @property
    def _used(self) -> int:
        return len(self._held) + self._claiming

    def _pending(self) -> dict[str, Ticket]:
        """The tickets of the jobs asked for, by id, oldest message first (lock held)."""
        return {j: t for asked in self._asked for j, t in asked.tickets.items()}

    def _needed(self, least: int) -> int:
        """`least`, but never more than the whole limit (which would never be free)."""
        return max(1, min(least, self._limit))

    def _free(self) -> int:
        """Places free for batch lines."""
        if self._closed or self._asked:
            return 0
        return max(0, self._limit - self._used)

    def _fits(self, count: int) -> bool:
        if self._closed:
            return False
        return self._used + count <= self._limit + self._single_extra or self._used == 0
