"""Claiming single jobs in Postgres, and giving back jobs that will not finish here.

A single job's task first waits for room at the capacity gate, then claims (see
worker/admission.py for why in that order); batch lines are claimed by the feeder
(worker/feeder.py). Each store call rides out a database outage as far as its caller can
afford: a task's claim retries with back-off until it succeeds, since its message is held
meanwhile; a give-back is tried a few times, since a job not given back is still safe
(its lease lapses and maintenance publishes it again), only later.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator, Sequence

from inferq.domain.jobs import ClaimedJob
from inferq.exceptions import JobsReturned, StoreUnavailable
from worker.capacity import CapacityGate
from worker.store import WorkerStore

log = logging.getLogger(__name__)

MAX_CLAIM_BACKOFF_S = 5.0
GIVE_BACK_ATTEMPTS = 5


class Claimer:
    """Takes jobs for this worker through the gate, and gives them back."""

    def __init__(
        self,
        *,
        store: WorkerStore,
        gate: CapacityGate,
        worker_name: str,
        lease_s: int,
        requeue_after_s: int,
    ) -> None:
        self._store = store
        self._gate = gate
        self._worker_name = worker_name
        self._lease_s = lease_s
        self._requeue_after_s = requeue_after_s
        # Job ids of tasks waiting at the gate: delivered here, not yet claimed.
        self._waiting: dict[int, list[str]] = {}
        self._lock = threading.Lock()

    def waiting(self) -> list[str]:
        """Jobs whose tasks wait at the gate (still queued, their messages here)."""
        with self._lock:
            return [job_id for ids in self._waiting.values() for job_id in ids]

    def take(self, job_ids: list[str]) -> list[ClaimedJob]:
        """Wait for room at the gate, then claim single jobs; room not used by a claim is
        given back.

        Raises `JobsReturned` if the gate closed (shutdown) meanwhile.
        """
        token = threading.get_ident()
        with self._lock:
            self._waiting[token] = job_ids
        try:
            if not self._gate.acquire(len(job_ids)):
                raise JobsReturned("the worker is shutting down")
        finally:
            with self._lock:
                self._waiting.pop(token, None)
        with self._room_back_on_error(len(job_ids)):
            claimed = self._claim(job_ids)
        self._gate.release(len(job_ids) - len(claimed))
        return claimed

    def give_back(self, job_ids: Sequence[str]) -> None:
        """Return unfinished jobs to queued in Postgres."""
        for attempt in range(GIVE_BACK_ATTEMPTS):
            try:
                self._store.release_jobs(
                    job_ids, worker=self._worker_name, requeue_after_s=self._requeue_after_s
                )
                return
            except StoreUnavailable as exc:
                # Their leases will lapse and maintenance will publish them: still safe.
                log.warning("cannot give back %d jobs yet (%s)", len(job_ids), exc)
                time.sleep(0.5 * (attempt + 1))

    @contextlib.contextmanager
    def _room_back_on_error(self, count: int) -> Iterator[None]:
        """Room taken for a claim goes back if the claim raises: kept, it would be lost
        for the life of the process, and enough of it would leave the worker taking
        nothing."""
        try:
            yield
        except BaseException:
            self._gate.release(count)
            raise

    def _claim(self, job_ids: list[str]) -> list[ClaimedJob]:
        backoff = 0.1
        while True:
            try:
                return self._store.claim_jobs(
                    job_ids, worker=self._worker_name, lease_s=self._lease_s
                )
            except StoreUnavailable as exc:
                log.warning("cannot claim %d jobs yet (%s); retrying", len(job_ids), exc)
                time.sleep(backoff)
                backoff = min(backoff * 2, MAX_CLAIM_BACKOFF_S)
