"""Celery tasks of the GPU worker, bound to the GpuWorker built at start-up."""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.exceptions import Reject

from inferq.constants import RUN_JOBS_TASK
from inferq.domain.queue_names import is_bulk
from inferq.exceptions import JobsReturned
from worker.gpu_worker import GpuWorker
from worker.pool import Handoff, door_pool


def register_gpu_tasks(app: Celery, gpu_worker: GpuWorker) -> None:
    """Register `run_jobs` on `app`, running on `gpu_worker`, and the pool that runs it
    (worker/pool.py)."""
    handoff = Handoff()
    app.conf.worker_pool = door_pool(handoff)

    @app.task(name=RUN_JOBS_TASK, bind=True)  # type: ignore[untyped-decorator]
    def run_jobs(self: Any, job_ids: list[str]) -> None:
        """Ask for the single jobs a message carries; the pool reports the task done
        once their outcomes are committed. A batch's message only wakes the feeder,
        which claims its lines."""
        queue = (self.request.delivery_info or {}).get("routing_key")
        if queue is not None and is_bulk(queue):
            gpu_worker.wake_batches()
            return
        try:
            handoff.put(self.request.id, gpu_worker.take(job_ids))
        except JobsReturned as exc:
            # Not acknowledged: the message goes back to Redis for another worker.
            raise Reject(exc.message, requeue=True) from exc
