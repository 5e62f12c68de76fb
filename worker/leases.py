"""The lease keeper: a thread that tells Postgres, every third of a lease, that this
worker is alive and still has its jobs.

A held job's lease is renewed, so maintenance does not hand it to another worker. A job
asked for at the door and not claimed yet is still queued, but its message is here: it is
marked as published just now, so maintenance does not think the message lost and publish
it again. A job whose lease cannot be renewed was cancelled, finished elsewhere or taken
over; the keeper tells the GPU worker to stop work on it (this also catches a
cancellation whose pub/sub message went missing).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from inferq.exceptions import StoreUnavailable
from inferq.host import supervision
from worker.store import WorkerStore

log = logging.getLogger(__name__)


class Holder(Protocol):
    """Whose leases the keeper renews: the GPU worker (worker/gpu_worker.py)."""

    def held_ids(self) -> list[str]:
        """The jobs it holds."""

    def asked_ids(self) -> list[str]:
        """The single jobs whose messages wait to claim them."""

    def cancel(self, job_ids: Sequence[str]) -> None:
        """Stop work on held jobs that are no longer its own."""


class LeaseKeeper(supervision.SupervisedThread):
    """Renews this worker's leases in its own thread."""

    thread_name = "leases"

    def __init__(
        self,
        *,
        store: WorkerStore,
        worker_name: str,
        lease_s: int,
        holder: Holder,
    ) -> None:
        self._store = store
        self._worker_name = worker_name
        self._lease_s = lease_s
        self._holder = holder
        super().__init__()

    def _run(self) -> None:
        interval = self._lease_s / 3
        while not self._stopping.wait(interval):
            self._renew()

    def _renew(self) -> None:
        held = self._holder.held_ids()
        waiting = self._holder.asked_ids()
        try:
            self._store.touch_published(waiting)
        except StoreUnavailable as exc:
            log.warning("cannot mark %d waiting jobs (%s)", len(waiting), exc)
        try:
            lost = self._store.renew_leases(held, worker=self._worker_name, lease_s=self._lease_s)
        except StoreUnavailable as exc:
            log.warning("cannot renew %d leases (%s)", len(held), exc)
            return
        if lost:
            log.info("%d jobs were cancelled or taken over; dropping them", len(lost))
            self._holder.cancel(sorted(lost))
