"""Jobs that wait while workers could take them: the fleet's view of stuck jobs.

A worker's own stall watch sees only what waits in its queues in Redis; a job whose
message was lost, or that sits behind a worker that stopped consuming, waits in Postgres
all the same. At each maintenance pass, for each served model whose workers say they have
room, its jobs queued longer than `stall_s` are stuck: logged in one warning line per
model, naming its workers with room, and counted for the API's `inferq_jobs_stalled`. A
worker's room is its last heartbeat's, a reading of one moment; alert on a lasting value."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from inferq.broker.stuck_jobs import StuckJobs
from inferq.broker.worker_registry import WorkerRegistry
from inferq.domain.queue_names import gpu_queues
from inferq.store.base import utcnow
from inferq.store.job_publishing import JobPublishing

log = logging.getLogger(__name__)


class FleetWatch:
    """Counts each served model's stuck jobs, says so, and records the counts."""

    def __init__(
        self,
        *,
        store: JobPublishing,
        workers: WorkerRegistry,
        stuck: StuckJobs,
        stall_s: float,
        record_ttl_s: float,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """`record_ttl_s`: how long the counts stand if no later pass replaces them."""
        self._store = store
        self._workers = workers
        self._stuck = stuck
        self._stall = timedelta(seconds=stall_s)
        self._record_ttl_s = record_ttl_s
        self._clock = clock

    def check(self, models: Iterable[str]) -> dict[str, int]:
        """The stuck jobs of each of these served models (their base names)."""
        online = self._workers.online()
        published_before = self._clock() - self._stall
        counts: dict[str, int] = {}
        for model in sorted(set(models)):
            with_room = sorted(w.name for w in online if w.model == model and w.room)
            # No worker with room: whatever waits, waits for room, and is not stuck.
            count = (
                self._store.count_waiting(
                    queues=gpu_queues(model), published_before=published_before
                )
                if with_room
                else 0
            )
            counts[model] = count
            if count:
                log.warning(
                    "%d jobs of %s have waited over %g s while its workers %s have room: "
                    "their messages may be lost, or the workers not consuming",
                    count,
                    model,
                    self._stall.total_seconds(),
                    ", ".join(with_room),
                )
        self._stuck.record(counts, ttl_s=self._record_ttl_s)
        return counts
