"""Waiting on a job through real Redis: woken by its announced end, by its re-read when
the announcement was lost, and let go when the client hangs up (no polling)."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest
from redis.asyncio import Redis as AsyncRedis

import api.waiter
from api.waiter import JobWaiter
from inferq.broker.events import done_channel
from inferq.domain.jobs import Job, JobStatus
from tests.conftest import REDIS_URL
from tests.helpers import jobs as job_helpers


def running_job() -> Job:
    return job_helpers.running_job("job_waited")


class Jobs:
    """The job as Postgres would have it, and how often it was read."""

    def __init__(self) -> None:
        self.job = running_job()
        self.reads = 0

    async def read(self, job_id: str) -> Job:
        assert job_id == self.job.id
        self.reads += 1
        return self.job

    def end(self) -> None:
        self.job = dataclasses.replace(self.job, status=JobStatus.SUCCEEDED)


@pytest.fixture
def fast_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.waiter, "RECHECK_S", 0.2)


def waiting(key_prefix: str, jobs: Jobs, scenario) -> object:  # type: ignore[no-untyped-def]
    """Runs `scenario(waiter, redis)` against a started waiter."""

    async def run() -> object:
        redis = AsyncRedis.from_url(REDIS_URL)
        waiter = JobWaiter(redis, key_prefix=key_prefix)
        await waiter.start()
        try:
            return await scenario(waiter, redis)
        finally:
            await waiter.stop()
            await redis.aclose()

    return asyncio.run(run())


def test_an_announced_end_wakes_the_wait(key_prefix: str) -> None:
    jobs = Jobs()

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        wait = asyncio.create_task(waiter.until_ended(jobs.job.id, jobs.read, timeout_s=30))
        while jobs.reads == 0:
            await asyncio.sleep(0.01)
        jobs.end()
        await redis.publish(done_channel(key_prefix, jobs.job.id), "x")
        return await wait

    started = time.monotonic()
    job = waiting(key_prefix, jobs, scenario)
    assert job.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10
    assert jobs.reads == 2  # when the wait began, and when woken


def test_an_end_whose_announcement_was_lost_is_found_by_a_re_read(
    key_prefix: str, fast_recheck: None
) -> None:
    jobs = Jobs()

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        wait = asyncio.create_task(waiter.until_ended(jobs.job.id, jobs.read, timeout_s=30))
        while jobs.reads == 0:
            await asyncio.sleep(0.01)
        jobs.end()  # and nobody announces it
        return await wait

    started = time.monotonic()
    job = waiting(key_prefix, jobs, scenario)
    assert job.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10


def test_a_client_that_hangs_up_ends_the_wait(key_prefix: str) -> None:
    jobs = Jobs()

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        hung_up = asyncio.Event()
        wait = asyncio.create_task(waiter.until_ended(jobs.job.id, jobs.read, gone=hung_up.wait()))
        while jobs.reads == 0:
            await asyncio.sleep(0.01)
        hung_up.set()
        return await wait

    job = waiting(key_prefix, jobs, scenario)
    assert job.status is JobStatus.RUNNING  # as it was: the caller cancels it
    assert jobs.reads == 1


def test_a_wait_that_times_out_returns_the_job_as_it_is_then(key_prefix: str) -> None:
    jobs = Jobs()

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        return await waiter.until_ended(jobs.job.id, jobs.read, timeout_s=0.3)

    job = waiting(key_prefix, jobs, scenario)
    assert job.status is JobStatus.RUNNING
    assert jobs.reads == 2  # at the start and at the deadline
