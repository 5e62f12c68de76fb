"""The worker's listener on Redis pub/sub: a cancel reaches the GpuWorker, and batch lines
queued on its queue (not another's) wake its feeder at once."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
import redis

from inferq.broker.events import JobEvents
from tests.conftest import REDIS_URL
from tests.helpers.waiting import wait_until
from worker.gpu_worker import GpuWorker
from worker.job_events import JobEventListener

WAIT_S = 10


class Heard(GpuWorker):
    """What the listener told the GpuWorker."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []
        self.woken = threading.Event()

    def cancel(self, job_ids: Sequence[str]) -> None:
        self.cancelled += job_ids

    def wake_batches(self) -> None:
        self.woken.set()


@pytest.fixture
def heard(key_prefix: str) -> Iterator[Heard]:
    client = redis.Redis.from_url(REDIS_URL)
    gpu_worker = Heard()
    listener = JobEventListener(
        client, key_prefix=key_prefix, gpu_worker=gpu_worker, batch_queue="bulk:mine"
    )
    listener.start()
    # Subscribed once a cancel published now is heard.
    events = JobEvents(client, key_prefix=key_prefix)
    wait_until(
        lambda: events.cancelled(["ping"]) or "ping" in gpu_worker.cancelled,
        timeout_s=WAIT_S,
        what="subscribed",
    )
    yield gpu_worker
    listener.stop()
    client.close()


def test_lines_queued_on_its_queue_wake_the_feeder_and_cancels_reach_the_runtime(
    heard: Heard, key_prefix: str
) -> None:
    events = JobEvents(redis.Redis.from_url(REDIS_URL), key_prefix=key_prefix)
    events.lines_queued("bulk:other")
    events.cancelled(["job_1", "job_2"])
    wait_until(lambda: "job_2" in heard.cancelled, timeout_s=WAIT_S, what="the cancel")
    # Published before the cancel, which was heard: the other queue's lines woke nobody.
    assert not heard.woken.is_set()
    events.lines_queued("bulk:mine")
    assert heard.woken.wait(WAIT_S)
