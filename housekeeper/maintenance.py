"""Periodic maintenance: Postgres is the truth, so whatever Redis lost is published again.

`Maintenance.run_once` publishes again every job that should be queued in Redis but may
not be (a lapsed lease, a message not taken within `requeue_after_s`, Redis's data lost,
a message delivered but never claimed), counts and logs stuck jobs (housekeeper/fleet.py),
estimates batches in progress again and runs retention (housekeeper/retention.py); one
housekeeper runs it at a time (a Redis lock). A duplicate message is harmless: a job is
claimed only while queued. Each case, in full: docs/how-it-works.md, "Maintain"."""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import cast

from redis import Redis
from redis.exceptions import LockError, RedisError
from redis.lock import Lock

from housekeeper.fleet import FleetWatch
from housekeeper.retention import Retention
from inferq.broker.celery_app import JobPublisher
from inferq.constants import (
    EPOCH_KEY,
    MAINTENANCE_LAST_RUN_KEY,
    MAINTENANCE_LOCK_KEY,
    RETENTION_PASSES_KEPT,
    RETENTION_PASSES_KEY,
)
from inferq.domain.queue_names import gpu_queues, is_bulk
from inferq.host import supervision
from inferq.operations.batch_estimates import BatchEstimates
from inferq.operations.batches import BatchLifecycle
from inferq.store.base import utcnow
from inferq.store.job_publishing import DueJob, JobPublishing

log = logging.getLogger(__name__)

BATCH_LIMIT = 10_000
LOCK_S = 15
"""How long a pass's lock outlives its holder: a housekeeper killed mid-pass holds up the
next pass this long at most. A pass renews it while it runs, however long it takes."""


@dataclass(frozen=True)
class MaintenanceReport:
    redis_lost: bool
    republished: int
    skipped: bool = False
    # Each served model's stuck jobs (housekeeper/fleet.py).
    stuck: dict[str, int] = field(default_factory=dict)


class Maintenance:
    """One maintenance pass; safe to run from several processes at once (a Redis lock
    lets one through) and safe to repeat."""

    def __init__(
        self,
        *,
        store: JobPublishing,
        publisher: JobPublisher,
        redis: Redis,
        key_prefix: str,
        requeue_after_s: int,
        unclaimed_after_s: int,
        batches: BatchLifecycle,
        estimates: BatchEstimates,
        webhooks_due: Callable[[], bool],
        retention: Retention,
        fleet: FleetWatch,
        served_models: Callable[[], Iterable[str]] = tuple,
        lock_s: float = LOCK_S,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store = store
        self._publisher = publisher
        self._redis = redis
        self._epoch_key = key_prefix + EPOCH_KEY
        self._lock_key = key_prefix + MAINTENANCE_LOCK_KEY
        self._last_run_key = key_prefix + MAINTENANCE_LAST_RUN_KEY
        self._requeue_after_s = requeue_after_s
        self._unclaimed_after = timedelta(seconds=unclaimed_after_s)
        self._key_prefix = key_prefix
        self._lock_s = lock_s
        self._clock = clock
        self._batches = batches
        self._estimates = estimates
        self._webhooks_due = webhooks_due
        self._retention = retention
        self._fleet = fleet
        self._served_models = served_models
        self._retention_key = key_prefix + RETENTION_PASSES_KEY

    def run_once(self) -> MaintenanceReport:
        # Not thread-local: the thread that renews it must see the token.
        lock = self._redis.lock(self._lock_key, timeout=self._lock_s, thread_local=False)
        if not lock.acquire(blocking=False):
            return MaintenanceReport(redis_lost=False, republished=0, skipped=True)
        ended = threading.Event()
        renewing = supervision.thread(self._renew, args=(lock, ended), name="maintenance-lock")
        renewing.start()
        try:
            report = self._run()
            self._redis.set(self._last_run_key, self._clock().isoformat())
            return report
        finally:
            ended.set()
            renewing.join()
            # It may have lapsed (Redis lost it, or was away past the lock's time).
            with contextlib.suppress(LockError):
                lock.release()

    def _renew(self, lock: Lock, ended: threading.Event) -> None:
        """Keep the lock while the pass runs, so a long pass holds it and a dead one
        frees it within `lock_s`."""
        while not ended.wait(self._lock_s / 3):
            try:
                lock.reacquire()
            except (LockError, RedisError) as exc:
                # Another pass may start meanwhile: harmless, passes are safe to overlap.
                log.warning("maintenance could not renew its lock: %s", exc)
                return

    def _run(self) -> MaintenanceReport:
        # SET NX succeeds only when the key is missing: the first pass ever, or Redis
        # forgot everything since the last one.
        redis_lost = bool(self._redis.set(self._epoch_key, uuid.uuid4().hex, nx=True))
        due: list[DueJob] = []
        if redis_lost:
            due += self._store.queued_jobs(requeue_after_s=self._requeue_after_s)
            if due:
                log.warning(
                    "Redis has no record of earlier work (lost data, or a first start): "
                    "publishing all %d queued jobs again",
                    len(due),
                )
        while True:
            batch = self._store.take_due(requeue_after_s=self._requeue_after_s, limit=BATCH_LIMIT)
            due += batch
            if len(batch) < BATCH_LIMIT:
                break
        models = list(self._served_models())
        # Single jobs only: feeders look for unclaimed batch lines in Postgres themselves.
        queues = [queue for model in models for queue in gpu_queues(model) if not is_bulk(queue)]
        for queue in queues:
            horizon = self._delivered_before(queue)
            if horizon is not None:
                due += self._store.take_unclaimed(
                    queue=queue,
                    published_before=horizon - self._unclaimed_after,
                    requeue_after_s=self._requeue_after_s,
                    limit=BATCH_LIMIT,
                )
        self._publish(due)
        # After publishing: a job just published again has not waited since.
        try:
            stuck = self._fleet.check(models)
        except Exception:  # a view for operators: it never stops the pass's real work
            log.exception("could not count stuck jobs")
            stuck = {}
        self._tend_batches()
        if self._webhooks_due():
            # Retries come due here, on Postgres' clock: no long Celery countdowns.
            self._publisher.publish_webhooks()
        if due and not redis_lost:
            log.warning("published %d jobs again (lapsed leases or lost messages)", len(due))
        self._keep_retention()
        return MaintenanceReport(redis_lost=redis_lost, republished=len(due), stuck=stuck)

    def _keep_retention(self) -> None:
        report = self._retention.run_once()
        entry = json.dumps({"at": self._clock().isoformat(), **report.as_dict()})
        pipe = self._redis.pipeline()
        pipe.lpush(self._retention_key, entry)
        pipe.ltrim(self._retention_key, 0, RETENTION_PASSES_KEPT - 1)
        pipe.execute()

    def _tend_batches(self) -> None:
        """Expire batches past their window; finalize any whose last line ended unseen;
        estimate those in progress again."""
        for batch_id in self._batches.expire_due():
            log.info("batch %s expired", batch_id, extra={"batch_id": batch_id})
        self._batches.finalize_finished()
        self._estimates.refresh()
        self._estimates.forget_gone_workers()

    def _delivered_before(self, queue: str) -> datetime | None:
        """A time before which every job of `queue` has had its message delivered: when
        the oldest waiting message was published, or now if the list is empty."""
        # redis-py types its sync client as sync-or-async; this one is sync.
        oldest = cast("bytes | str | None", self._redis.lindex(self._key_prefix + queue, -1))
        if oldest is None:
            return self._clock()
        job_ids = _job_ids(oldest)
        return self._store.published_at(job_ids) if job_ids else None

    def _publish(self, jobs: Sequence[DueJob]) -> None:
        by_queue: dict[str, list[str]] = {}
        for job in jobs:
            by_queue.setdefault(job.queue, []).append(job.id)
        for queue, ids in by_queue.items():
            if is_bulk(queue):
                self._publisher.publish_bulk(ids, queue=queue)
            else:
                self._publisher.publish_interactive(ids, queue=queue)


def _job_ids(raw: bytes | str) -> list[str]:
    """The job ids in a kombu message as it sits in Redis: JSON around a base64 body that
    holds Celery's [args, kwargs, embed]; `run_jobs` takes the ids as its one argument."""
    try:
        envelope = json.loads(raw)
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        args = json.loads(body)[0]
        return [str(job_id) for job_id in args[0]]
    except (ValueError, KeyError, IndexError, TypeError):
        return []
