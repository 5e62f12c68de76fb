"""Maintenance on real Redis and Postgres, without workers (heartbeats stand in for them
where one is needed): what it publishes again, what it leaves alone, and the jobs it
finds stuck."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis import Redis

from housekeeper.fleet import FleetWatch
from housekeeper.maintenance import Maintenance, _job_ids
from housekeeper.retention import Retention, RetentionReport
from inferq.app import App
from inferq.broker.celery_app import JobPublisher, make_celery
from inferq.domain.jobs import JobSpec, JobStatus, SamplingParams
from inferq.domain.queue_names import bulk_queue, interactive_queue
from inferq.exceptions import BrokerUnavailable
from inferq.settings import Settings
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore
from tests.conftest import REDIS_URL
from tests.helpers.heartbeats import beat
from tests.helpers.jobs import create_jobs
from tests.helpers.processes import free_port

INTERACTIVE_QUEUE = interactive_queue("m")
BULK_QUEUE = bulk_queue("m")
STALL_S = 120


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


class Harness:
    def __init__(self, database_url: str, key_prefix: str) -> None:
        self.clock = Clock()
        self.engine = make_database(database_url, pool_size=2)
        self.store = JobStore(make_sessions(self.engine), clock=self.clock)
        self.redis = Redis.from_url(REDIS_URL)
        self.prefix = key_prefix
        settings = Settings(
            database_url=database_url, redis_url=REDIS_URL, redis_key_prefix=key_prefix
        )
        self.app = App(settings, pool_size=2)
        self.publisher = JobPublisher(self.app.celery, bulk_chunk_size=2)
        # Kept for ever: these tests look at what is published again, not deleted.
        self.maintenance = self.maintenance_with(
            Retention(self.app.retention, job_retention_s=0, webhook_retention_s=0)
        )

    def maintenance_with(self, retention: Retention, **options: Any) -> Maintenance:
        return Maintenance(
            store=self.store,
            publisher=self.publisher,
            redis=self.redis,
            key_prefix=self.prefix,
            requeue_after_s=3600,
            unclaimed_after_s=30,
            batches=self.app.batch_lifecycle,
            estimates=self.app.batch_estimates,
            webhooks_due=self.app.webhooks.due,
            retention=retention,
            fleet=FleetWatch(
                store=self.store,
                workers=self.app.workers,
                stuck=self.app.stuck_jobs,
                stall_s=STALL_S,
                record_ttl_s=45,
                clock=self.clock,
            ),
            served_models=lambda: ["m"],
            clock=self.clock,
            **options,
        )

    def create(self, count: int, queue: str = INTERACTIVE_QUEUE) -> list[str]:
        spec = JobSpec(
            model="m",
            prompt="p",
            messages=None,
            prompt_token_ids=[1],
            sampling=SamplingParams(max_tokens=1),
        )
        jobs = create_jobs(self.store, [spec] * count, queue=queue, requeue_after_s=3600)
        return [j.id for j in jobs]

    def queued_messages(self, queue: str = INTERACTIVE_QUEUE) -> list[list[str]]:
        """Job ids of each message waiting in `queue`, oldest first."""
        raw = self.redis.lrange(self.prefix + queue, 0, -1)
        return [_job_ids(message) for message in reversed(raw)]


@pytest.fixture
def harness(database_url: str, key_prefix: str) -> Iterator[Harness]:
    made = Harness(database_url, key_prefix)
    made.maintenance.run_once()  # the first pass ever sets the epoch
    made.redis.delete(key_prefix + INTERACTIVE_QUEUE, key_prefix + BULK_QUEUE)
    yield made
    made.engine.dispose()
    made.app.close()


def test_a_lapsed_lease_returns_the_job_to_the_queue(harness: Harness) -> None:
    [held, fresh] = harness.create(2)
    harness.store.claim_jobs([held, fresh], worker="dead", lease_s=10)
    harness.store.renew_leases([fresh], worker="dead", lease_s=100)
    harness.clock.now += timedelta(seconds=11)
    report = harness.maintenance.run_once()
    assert report.republished == 1
    assert harness.queued_messages() == [[held]]
    assert harness.store.get_job(held).status is JobStatus.QUEUED
    assert harness.store.get_job(fresh).status is JobStatus.RUNNING


def test_a_delivered_but_unclaimed_job_is_published_again_after_a_lease(
    harness: Harness,
) -> None:
    [lost] = harness.create(1)  # its message was taken by a worker that then died
    harness.clock.now += timedelta(seconds=10)
    assert harness.maintenance.run_once().republished == 0  # too soon to tell
    harness.clock.now += timedelta(seconds=30)
    assert harness.maintenance.run_once().republished == 1
    assert harness.queued_messages() == [[lost]]
    # Its message now waits in the list, so the next pass leaves it alone.
    harness.clock.now += timedelta(seconds=60)
    assert harness.maintenance.run_once().republished == 0


def test_jobs_behind_a_waiting_message_are_not_published_again(harness: Harness) -> None:
    first, second = harness.create(2)
    harness.publisher.publish_interactive([first, second], queue=INTERACTIVE_QUEUE)
    harness.clock.now += timedelta(hours=1) - timedelta(seconds=1)
    assert harness.maintenance.run_once().republished == 0
    # Jobs submitted together travel in one message.
    assert harness.queued_messages() == [[first, second]]


def test_after_redis_loses_everything_every_queued_job_is_published_again(
    harness: Harness,
) -> None:
    interactive = harness.create(3)
    bulk = harness.create(5, queue=BULK_QUEUE)
    running = harness.create(1)
    harness.store.claim_jobs(running, worker="alive", lease_s=600)
    harness.redis.delete(*harness.redis.keys(harness.prefix + "*"))  # what FLUSHALL does to us
    report = harness.maintenance.run_once()
    assert report.redis_lost
    assert report.republished == 8
    assert sorted(j for m in harness.queued_messages() for j in m) == sorted(interactive)
    # Batch lines: one message wakes the model's feeders, which claim the lines from
    # Postgres (it names the first of them, for Flower).
    [wake_up] = harness.queued_messages(BULK_QUEUE)
    assert wake_up
    assert set(wake_up) <= set(bulk)


def test_one_pass_at_a_time(harness: Harness) -> None:
    harness.redis.set(harness.prefix + "maintenance:lock", "someone-else", ex=60)
    assert harness.maintenance.run_once().skipped


class HeldRetention(Retention):
    """Retention that holds its pass until told to go on: a long pass."""

    def __init__(self, retention: Retention) -> None:
        self._retention = retention
        self.entered, self.go_on = threading.Event(), threading.Event()

    def run_once(self) -> RetentionReport:
        self.entered.set()
        self.go_on.wait(timeout=60)
        return self._retention.run_once()


def test_a_long_pass_keeps_its_lock_and_a_killed_one_frees_it_within_the_locks_time(
    harness: Harness,
) -> None:
    lock_s = 0.6
    held = HeldRetention(Retention(harness.app.retention, job_retention_s=0, webhook_retention_s=0))
    long_pass = harness.maintenance_with(held, lock_s=lock_s)
    running = threading.Thread(target=long_pass.run_once)
    running.start()
    try:
        assert held.entered.wait(timeout=30)
        lock_key = harness.prefix + "maintenance:lock"
        # For several times the lock's time, every other pass is skipped: the pass renews
        # its lock. Its time left never exceeds lock_s, which is how long a housekeeper
        # killed mid-pass (no renewals any more) holds up the next pass.
        until = time.monotonic() + 4 * lock_s
        while time.monotonic() < until:
            assert harness.maintenance.run_once().skipped
            assert 0 < harness.redis.pttl(lock_key) <= lock_s * 1000
    finally:
        held.go_on.set()
        running.join(timeout=60)
    assert not harness.redis.exists(lock_key)  # let go at the end
    assert not harness.maintenance.run_once().skipped


@pytest.mark.parametrize("publish", ["bulk", "interactive"])
def test_publishing_to_a_redis_that_is_down_says_so(publish: str) -> None:
    # Callers keep the jobs in Postgres for maintenance on BrokerUnavailable, and only on it.
    app = make_celery(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    publisher = JobPublisher(app, bulk_chunk_size=2)
    with pytest.raises(BrokerUnavailable, match="could not publish to Redis"):
        getattr(publisher, f"publish_{publish}")(["job_a", "job_b", "job_c"], queue="q:m")


def test_a_job_stored_while_redis_was_down_is_published_at_the_next_pass(
    harness: Harness,
) -> None:
    [job] = harness.create(1)
    harness.publisher.publish_interactive(
        [], queue=INTERACTIVE_QUEUE
    )  # nothing reached Redis for it
    harness.store.mark_unpublished([job])
    assert harness.maintenance.run_once().republished == 1
    assert harness.queued_messages() == [[job]]


def test_jobs_queued_past_the_bound_while_a_worker_has_room_are_stuck(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    # Their messages wait in Redis (none was delivered and left unclaimed) and no worker takes them.
    old = harness.create(2)
    harness.publisher.publish_interactive(old, queue=INTERACTIVE_QUEUE)
    old_line = harness.create(1, queue=BULK_QUEUE)
    harness.publisher.publish_bulk(old_line, queue=BULK_QUEUE)
    running = harness.create(1)  # taken: it waits for nothing
    harness.store.claim_jobs(running, worker="gpu-idle@test", lease_s=3600)
    harness.clock.now += timedelta(seconds=STALL_S + 1)
    young = harness.create(1)
    harness.publisher.publish_interactive(young, queue=INTERACTIVE_QUEUE)
    beat(harness.prefix, name="gpu-idle@test", model="m", room=True)
    beat(harness.prefix, name="gpu-full@test", model="m", room=False)
    beat(harness.prefix, name="gpu-other@test", model="other", room=True)

    with caplog.at_level(logging.WARNING, logger="housekeeper.fleet"):
        report = harness.maintenance.run_once()

    assert report.stuck == {"m": 3}
    assert report.republished == 0
    [line] = [r.getMessage() for r in caplog.records if r.name == "housekeeper.fleet"]
    assert line == (
        "3 jobs of m have waited over 120 s while its workers gpu-idle@test have room: "
        "their messages may be lost, or the workers not consuming"
    )
    # What the API's /metrics reads, until a few passes have gone by without maintenance.
    assert harness.app.stuck_jobs.counts() == {"m": 3}
    assert 0 < harness.redis.ttl(harness.prefix + "jobs:stalled") <= 45


def test_jobs_waiting_for_room_are_not_stuck(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    old = harness.create(2)
    harness.publisher.publish_interactive(old, queue=INTERACTIVE_QUEUE)
    harness.clock.now += timedelta(seconds=STALL_S + 1)
    beat(harness.prefix, name="gpu-full@test", model="m", room=False)
    # Room on a worker of another model takes none of them.
    beat(harness.prefix, name="gpu-other@test", model="other", room=True)

    with caplog.at_level(logging.WARNING, logger="housekeeper.fleet"):
        assert harness.maintenance.run_once().stuck == {"m": 0}
    assert [r for r in caplog.records if r.name == "housekeeper.fleet"] == []
    assert harness.app.stuck_jobs.counts() == {"m": 0}


def test_jobs_queued_for_less_than_the_bound_are_not_stuck(harness: Harness) -> None:
    jobs = harness.create(2)
    harness.publisher.publish_interactive(jobs, queue=INTERACTIVE_QUEUE)
    beat(harness.prefix, name="gpu-idle@test", model="m", room=True)
    harness.clock.now += timedelta(seconds=STALL_S - 1)
    assert harness.maintenance.run_once().stuck == {"m": 0}
    # A worker that took their message holds them until its engine has room, and says so.
    harness.store.touch_published(jobs)
    harness.clock.now += timedelta(seconds=2)
    assert harness.maintenance.run_once().stuck == {"m": 0}
    # Held by nobody for the bound: stuck.
    harness.clock.now += timedelta(seconds=STALL_S)
    assert harness.maintenance.run_once().stuck == {"m": 2}
