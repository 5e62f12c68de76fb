"""Waiting on a job through real Redis: woken by its announced end, by the sweep when
the announcement was lost, and let go when the client hangs up; a wait reads the job
when it starts (unless it was watched before it was written) and when woken, not on a
timer."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from redis.asyncio import Redis as AsyncRedis
from redis.asyncio.client import PubSub

import api.waiter
from api.submission import succeeded
from api.waiter import JobWaiter
from inferq.broker.events import announce_end, batch_progress_channel, done_channel
from inferq.domain.jobs import Choice, Job, JobResult, JobStatus
from tests.conftest import REDIS_URL
from tests.helpers import jobs as job_helpers


def running_job() -> Job:
    return job_helpers.running_job("job_waited")


class Jobs:
    """The job as Postgres would have it, and how often it was read."""

    def __init__(self) -> None:
        self.job = running_job()
        self.reads = 0
        self.swept: list[list[str]] = []

    async def read(self, job_id: str) -> Job:
        assert job_id == self.job.id
        self.reads += 1
        return self.job

    def end(self) -> None:
        self.job = dataclasses.replace(self.job, status=JobStatus.SUCCEEDED)

    def ended_among(self, job_ids: list[str]) -> Collection[str]:
        self.swept.append(job_ids)
        return [i for i in job_ids if i == self.job.id and self.job.status.is_terminal]


@pytest.fixture
def fast_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api.waiter, "RECHECK_S", 0.2)


def waiting(key_prefix: str, jobs: Jobs, scenario, *, sweep: bool = True) -> object:  # type: ignore[no-untyped-def]
    """Runs `scenario(waiter, redis)` against a started waiter."""

    async def run() -> object:
        redis = AsyncRedis.from_url(REDIS_URL)
        ended_among = jobs.ended_among if sweep else (lambda _ids: ())
        waiter = JobWaiter(redis, key_prefix=key_prefix, ended_among=ended_among)
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
    job = waiting(key_prefix, jobs, scenario, sweep=False)
    assert job.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10
    assert jobs.reads == 2  # when the wait began, and when woken


def test_a_batch_lines_end_is_heard_on_its_batchs_channel(key_prefix: str) -> None:
    jobs = Jobs()
    jobs.job = dataclasses.replace(jobs.job, batch_id="batch_waited")

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        wait = asyncio.create_task(waiter.until_ended(jobs.job.id, jobs.read, timeout_s=30))
        # Read as the wait began, and again once the batch's channel was watched.
        while jobs.reads < 2:
            await asyncio.sleep(0.01)
        jobs.end()
        await redis.publish(batch_progress_channel(key_prefix, "batch_waited"), b"")
        return await wait

    started = time.monotonic()
    job = waiting(key_prefix, jobs, scenario, sweep=False)
    assert job.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10
    assert jobs.reads == 3


@pytest.mark.parametrize("with_result", [True, False], ids=["with-result", "without"])
def test_an_end_announced_with_its_result_is_answered_without_a_read(
    key_prefix: str, with_result: bool
) -> None:
    jobs = Jobs()
    choices = (Choice(index=0, text="hi \u0000 there", finish_reason="stop", completion_tokens=3),)
    started_at = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    finished_at = started_at + timedelta(seconds=1.5)
    announced = announce_end(
        JobResult(choices=choices, prompt_tokens=1),
        started_at=started_at,
        finished_at=finished_at,
        attempts=2,
    )

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        wait = asyncio.create_task(
            waiter.until_ended(
                jobs.job.id,
                jobs.read,
                timeout_s=30,
                ended=functools.partial(succeeded, jobs.job),
            )
        )
        while jobs.reads == 0:
            await asyncio.sleep(0.01)
        jobs.end()
        # A failure, a cancel or an embedding is announced with nothing: the job is read.
        await redis.publish(
            done_channel(key_prefix, jobs.job.id), announced if with_result else b""
        )
        return await wait

    job = waiting(key_prefix, jobs, scenario, sweep=False)
    assert job.status is JobStatus.SUCCEEDED
    if with_result:
        assert job.result is not None
        assert job.result.choices == choices
        assert (job.started_at, job.finished_at, job.attempts) == (started_at, finished_at, 2)
        assert jobs.reads == 1  # when the wait began only
    else:
        assert jobs.reads == 2


def test_a_job_watched_before_it_was_written_is_read_only_when_woken(key_prefix: str) -> None:
    jobs = Jobs()

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        async with waiter.watch(jobs.job.id) as woken:
            written = jobs.job
            # It ends, and its end is announced, before the wait begins: still heard.
            jobs.end()
            await redis.publish(done_channel(key_prefix, jobs.job.id), "x")
            return await waiter.wait(woken, written, jobs.read, timeout_s=30)

    started = time.monotonic()
    job = waiting(key_prefix, jobs, scenario, sweep=False)
    assert job.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10
    assert jobs.reads == 1  # when woken, not before


def test_an_end_whose_announcement_was_lost_is_found_by_the_sweep(
    key_prefix: str, fast_sweep: None
) -> None:
    jobs = Jobs()

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        wait = asyncio.create_task(waiter.until_ended(jobs.job.id, jobs.read, timeout_s=30))
        while not jobs.swept:  # the sweep sees the job waited on...
            await asyncio.sleep(0.01)
        jobs.end()  # ...which then ends, and nobody announces it
        return await wait

    started = time.monotonic()
    job = waiting(key_prefix, jobs, scenario)
    assert job.status is JobStatus.SUCCEEDED
    assert time.monotonic() - started < 10
    assert jobs.reads == 2
    assert all(ids == [jobs.job.id] for ids in jobs.swept)


def test_a_wait_reads_the_job_no_more_while_nothing_happens(
    key_prefix: str, fast_sweep: None
) -> None:
    jobs = Jobs()

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> Job:
        wait = asyncio.create_task(waiter.until_ended(jobs.job.id, jobs.read, timeout_s=30))
        while len(jobs.swept) < 5:  # a second of sweeps
            await asyncio.sleep(0.01)
        jobs.end()
        await redis.publish(done_channel(key_prefix, jobs.job.id), "x")
        return await wait

    job = waiting(key_prefix, jobs, scenario)
    assert job.status is JobStatus.SUCCEEDED
    assert jobs.reads == 2


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

    job = waiting(key_prefix, jobs, scenario, sweep=False)
    assert job.status is JobStatus.RUNNING
    assert jobs.reads == 2  # at the start and at the deadline


def test_watches_begun_together_subscribe_in_one_command_and_each_hears_its_end(
    key_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[tuple[str, int]] = []
    send = PubSub.execute_command

    async def counted(self: PubSub, *args: Any) -> Any:
        sent.append((str(args[0]), len(args) - 1))
        return await send(self, *args)

    monkeypatch.setattr(PubSub, "execute_command", counted)
    ids = [f"job_together_{i}" for i in range(64)]

    async def scenario(waiter: JobWaiter, redis: AsyncRedis) -> list[bytes | str]:
        sent.clear()  # the listener's own subscription
        async with contextlib.AsyncExitStack() as watches:
            woken = [await watches.enter_async_context(waiter.watch(i)) for i in ids[:1]]
            woken += await asyncio.gather(
                *(watches.enter_async_context(waiter.watch(i)) for i in ids[1:])
            )
            for job_id in ids:
                await redis.publish(done_channel(key_prefix, job_id), job_id)
            await asyncio.wait_for(asyncio.gather(*(w.wait() for w in woken)), 10)
        # Let go together too; the one let go and watched again at once still hears.
        async with waiter.watch(ids[0]) as again:
            await redis.publish(done_channel(key_prefix, ids[0]), b"again")
            await asyncio.wait_for(again.wait(), 10)
        return [w.announced for w in woken] + [again.announced]

    heard = waiting(key_prefix, Jobs(), scenario, sweep=False)
    assert heard == [i.encode() for i in ids] + [b"again"]
    subscribes = [n for command, n in sent if command == "SUBSCRIBE"]
    # The first alone (nothing else was waiting), the other 63 together, then the last.
    assert subscribes == [1, 63, 1]
    assert [n for command, n in sent if command == "UNSUBSCRIBE"] == [63]
