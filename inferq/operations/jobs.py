"""What can be done to single jobs: submit them (many at once), read, list and cancel.
Used by the API; every operation is one store call and at most one publish."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from inferq.broker.celery_app import JobPublisher
from inferq.broker.events import JobEvents
from inferq.broker.queues import QueueMonitor
from inferq.domain.jobs import Job, JobStatus
from inferq.domain.queue_names import interactive_queue
from inferq.exceptions import BrokerUnavailable, InferqError, NotFound, RetryLater
from inferq.store.base import Page
from inferq.store.jobs import JobStore, NewJob
from inferq.wire.public import job_json

log = logging.getLogger(__name__)

# How long a client refused for a full queue should wait before it tries again.
QUEUE_FULL_RETRY_S = 10


class JobOperations:
    def __init__(
        self,
        *,
        store: JobStore,
        publisher: JobPublisher,
        events: JobEvents,
        queues: QueueMonitor,
        high_water: int,
        requeue_after_s: int,
        respond: Callable[[Job], dict[str, Any]] = job_json,
    ) -> None:
        """`respond` renders a new job as the body of its 202, to be remembered for an
        idempotent submission."""
        self.store = store
        self._publisher = publisher
        self._events = events
        self._queues = queues
        self._high_water = high_water
        self._requeue_after_s = requeue_after_s
        self._respond = respond

    def submit(self, new_jobs: Sequence[NewJob]) -> list[Job | InferqError]:
        """Write these jobs in one transaction and publish them together.

        Returns each one's job, or the error that refused it: a model's jobs are refused
        while its interactive queue is over its high-water mark, and a key's over its quota
        (api/errors.py answers 429, with when it frees up). A job whose publish fails
        is kept (maintenance publishes it once Redis is back).
        """
        outcome: list[Job | InferqError | None] = [None] * len(new_jobs)
        accepted: list[int] = []
        for model in {new.spec.served_by for new in new_jobs}:
            depth = self._queues.depth(interactive_queue(model))
            picked = [i for i, new in enumerate(new_jobs) if new.spec.served_by == model]
            if depth < self._high_water:
                accepted += picked
                continue
            full = RetryLater(
                f"the interactive queue of {model} holds {depth} jobs, over its limit of "
                f"{self._high_water}: retry later, or send bulk work as a batch file "
                "(/v1/batches), which is always accepted",
                retry_after_s=QUEUE_FULL_RETRY_S,
                code="queue_full",
            )
            for i in picked:
                outcome[i] = full
        accepted.sort()
        jobs = self.store.submit_jobs(
            [new_jobs[i] for i in accepted],
            queue=lambda spec: interactive_queue(spec.served_by),
            requeue_after_s=self._requeue_after_s,
            respond=self._respond,
        )
        written: list[Job] = []
        by_model: dict[str, list[str]] = {}
        for i, job in zip(accepted, jobs, strict=True):
            outcome[i] = job
            if isinstance(job, Job):
                written.append(job)
                by_model.setdefault(new_jobs[i].spec.served_by, []).append(job.id)
        for model, ids in by_model.items():
            try:
                self._publisher.publish_interactive(ids, queue=interactive_queue(model))
            except BrokerUnavailable as exc:
                log.warning("%d jobs are stored but not yet published: %s", len(ids), exc.message)
                self.store.mark_unpublished(ids)
        for job in written:
            log.info("accepted job %s", job.id, extra={"job_id": job.id, "tenant": job.tenant})
        return [item for item in outcome if item is not None]

    def ended_among(self, job_ids: list[str]) -> set[str]:
        """Which of these jobs have ended (whatever their tenant: only a wake-up is decided
        by it, the job is read again in its reader's scope)."""
        return self.store.ended_among(job_ids)

    def get_many(self, reads: Sequence[tuple[str, str | None]]) -> list[Job | InferqError]:
        """Jobs by `(id, scope)` in one query, in order; `NotFound` for an id that does not
        exist or belongs to another tenant than `scope` (None sees every tenant)."""
        found = {job.id: job for job in self.store.get_jobs([job_id for job_id, _ in reads])}
        return [_in_scope(found.get(job_id), job_id, scope) for job_id, scope in reads]

    def list(
        self,
        *,
        scope: str | None,
        status: JobStatus | None,
        batch_id: str | None,
        after: str | None,
        limit: int,
    ) -> Page[Job]:
        return self.store.list_jobs(
            scope=scope, status=status, batch_id=batch_id, after=after, limit=limit
        )

    def cancel(self, job_id: str, *, scope: str | None) -> Job:
        """Cancel a queued or running job; its worker hears of it at once."""
        job = self.store.cancel_job(job_id, scope=scope)
        self._events.cancelled([job.id])
        return job


def _in_scope(job: Job | None, job_id: str, scope: str | None) -> Job | InferqError:
    # Another tenant's job is "not found", so ids cannot be probed across tenants.
    if job is None or (scope is not None and job.tenant != scope):
        return NotFound(f"no job with id {job_id!r}")
    return job
