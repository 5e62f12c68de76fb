"""What the GPU worker asks of the job store.

`inferq.store.jobs.JobStore` is the store (these calls are its `inferq.store.job_leases`
half); the GPU worker, the lease keeper and the result writer depend only on these calls, so
unit tests can run them on an in-memory store.
Every call may raise `StoreUnavailable` while the database cannot be reached.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from inferq.domain.fair_share import FleetShare
from inferq.domain.jobs import ClaimedJob, JobOutcome


class WorkerStore(Protocol):
    """The job store's calls that a GPU worker makes."""

    def claim_jobs(self, job_ids: Sequence[str], *, worker: str, lease_s: int) -> list[ClaimedJob]:
        """Take queued jobs, and running ones whose lease ran out, for `worker`."""

    def claim_batch_lines(
        self,
        *,
        queue: str,
        worker: str,
        lease_s: int,
        limit: int,
        fleet: FleetShare = ...,
    ) -> list[ClaimedJob]:
        """Take up to `limit` queued batch lines of `queue`, no more than this worker's
        share in `fleet` of those left, shared fairly between tenants."""

    def renew_leases(self, job_ids: Sequence[str], *, worker: str, lease_s: int) -> set[str]:
        """Extend `worker`'s leases; return the ids it no longer holds."""

    def touch_published(self, job_ids: Sequence[str]) -> None:
        """Note that these queued jobs' messages are held by a live worker right now."""

    def give_back_jobs(
        self, job_ids: Sequence[str], *, worker: str, requeue_after_s: int
    ) -> list[str]:
        """Give `worker`'s unfinished jobs back (status queued); return the ids given back."""

    def finish_jobs(
        self, outcomes: Sequence[JobOutcome], *, now: datetime | None = None
    ) -> list[str]:
        """Write outcomes of jobs still queued or running, as finished at `now` (the
        store's clock if None); return the ids written."""
