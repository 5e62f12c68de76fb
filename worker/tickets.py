"""The jobs a worker holds, each with the ticket its Celery task waits on.

A job is held from its claim until its outcome is committed, it is cancelled, or it goes
back to the queue; then its ticket is ended, which lets the task return. Two
messages that carry the same job (a redelivery) wait on one ticket, so the job runs once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from datetime import datetime

from inferq.domain.jobs import ClaimedJob

# How many recent cancels a worker remembers; a claim that raced one ends within
# milliseconds, so this only needs to outlast a burst of cancels.
REMEMBERED_CANCELS = 10_000


class Ticket:
    """A task's handle on one job: set when the job has ended here, one way or another."""

    __slots__ = ("batch_id", "created_at", "done", "returned")

    def __init__(self, created_at: datetime, batch_id: str | None) -> None:
        self.done = threading.Event()
        self.returned = False
        self.created_at = created_at
        self.batch_id = batch_id

    def end(self, *, returned: bool) -> None:
        """Wake the tasks waiting on this job; `returned`: it went back to the queue."""
        self.returned = returned
        self.done.set()


class Tickets:
    """The held jobs by id. Thread-safe."""

    def __init__(self) -> None:
        self._tickets: dict[str, Ticket] = {}
        # Jobs cancelled lately, held or not: a job claimed just before its cancel
        # committed may get its ticket after the cancel was heard (see `cancel`).
        self._cancelled: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._tickets)

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._tickets)

    def cancel(self, job_ids: Sequence[str]) -> list[str]:
        """Those of `job_ids` held here; the others are remembered as cancelled, for
        `cancelled` to find once a claim that raced the cancel has issued their tickets."""
        with self._lock:
            held = [j for j in job_ids if j in self._tickets]
            for job_id in job_ids:
                if job_id not in self._tickets:
                    self._cancelled[job_id] = None
            while len(self._cancelled) > REMEMBERED_CANCELS:
                self._cancelled.popitem(last=False)
            return held

    def cancelled(self, job_ids: Sequence[str]) -> list[str]:
        """Those of `job_ids` cancelled before they were held here (forgotten now)."""
        with self._lock:
            found = [j for j in job_ids if j in self._cancelled]
            for job_id in found:
                del self._cancelled[job_id]
            return found

    def split(self, job_ids: Sequence[str]) -> tuple[list[Ticket], list[str]]:
        """The tickets of those of `job_ids` held here, and the ids of the others."""
        with self._lock:
            known = [self._tickets[j] for j in job_ids if j in self._tickets]
            fresh = [j for j in job_ids if j not in self._tickets]
        return known, fresh

    def issue(self, claimed: Sequence[ClaimedJob]) -> list[Ticket]:
        """Tickets for jobs just claimed (the one already issued, for a job held twice)."""
        with self._lock:
            return [
                self._tickets.setdefault(job.id, Ticket(job.created_at, job.batch_id))
                for job in claimed
            ]

    def get(self, job_ids: Sequence[str]) -> list[Ticket]:
        """The tickets of those of `job_ids` held here."""
        with self._lock:
            return [self._tickets[j] for j in job_ids if j in self._tickets]

    def batch_ids(self) -> set[str | None]:
        """The batches whose lines are held here (None for single jobs)."""
        with self._lock:
            return {t.batch_id for t in self._tickets.values()}

    def pop(self, job_ids: Sequence[str]) -> list[Ticket]:
        """Stop holding these jobs; return the tickets of those that were held, to end."""
        with self._lock:
            return [t for t in (self._tickets.pop(j, None) for j in job_ids) if t is not None]
