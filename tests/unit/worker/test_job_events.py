"""The job-event listener, on pub/sub in memory: a cancel reaches the GpuWorker with its ids,
lines queued on its own queue wake the feeder, and a lost connection is subscribed again."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence

import pytest

from inferq.broker.events import cancel_channel, lines_channel
from tests.helpers.fakes import MemoryPubSub
from worker import job_events
from worker.job_events import JobEventListener

WAIT_S = 10
PREFIX = "test:"


class Heard:
    """The GpuWorker calls the listener makes, recorded."""

    def __init__(self) -> None:
        self.cancelled: list[list[str]] = []
        self.wakes = 0
        self.changed = threading.Condition()

    def cancel(self, job_ids: Sequence[str]) -> None:
        with self.changed:
            self.cancelled.append(list(job_ids))
            self.changed.notify_all()

    def wake_batches(self) -> None:
        with self.changed:
            self.wakes += 1
            self.changed.notify_all()

    def wait_for(self, predicate: object) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, WAIT_S)  # type: ignore[arg-type]


@pytest.fixture
def redis(monkeypatch: pytest.MonkeyPatch) -> MemoryPubSub:
    # Short waits, so that stopping and subscribing again take milliseconds.
    monkeypatch.setattr(job_events, "READ_S", 0.01)
    monkeypatch.setattr(job_events, "RECONNECT_S", 0.01)
    return MemoryPubSub()


@pytest.fixture
def heard(redis: MemoryPubSub) -> Iterator[Heard]:
    gpu_worker = Heard()
    listener = JobEventListener(
        redis,  # type: ignore[arg-type]
        key_prefix=PREFIX,
        gpu_worker=gpu_worker,  # type: ignore[arg-type]
        batch_queue="bulk:mine",
    )
    listener.start()
    assert redis.wait_for(lambda: bool(redis.open()), WAIT_S)
    yield gpu_worker
    listener.stop()
    # Its subscription is closed and its thread ended.
    assert redis.open() == []
    assert not [t for t in threading.enumerate() if t.name == "job-events"]


def _cancel(redis: MemoryPubSub, *job_ids: str) -> int:
    return redis.publish(cancel_channel(PREFIX), json.dumps(job_ids).encode())


def test_it_listens_to_cancels_and_its_own_queues_lines_only(
    redis: MemoryPubSub, heard: Heard
) -> None:
    [subscription] = redis.open()
    assert subscription.channels == {cancel_channel(PREFIX), lines_channel(PREFIX, "bulk:mine")}
    assert redis.publish(lines_channel(PREFIX, "bulk:other"), b"") == 0


def test_a_cancel_reaches_the_gpu_worker_with_its_ids_and_lines_wake_the_feeder(
    redis: MemoryPubSub, heard: Heard
) -> None:
    redis.publish(lines_channel(PREFIX, "bulk:mine"), b"")
    _cancel(redis, "job_1", "job_2")
    heard.wait_for(lambda: heard.cancelled)
    assert heard.cancelled == [["job_1", "job_2"]]
    assert heard.wakes == 1


def test_a_listener_without_a_queue_hears_only_cancels(redis: MemoryPubSub) -> None:
    gpu_worker = Heard()
    listener = JobEventListener(redis, key_prefix=PREFIX, gpu_worker=gpu_worker)  # type: ignore[arg-type]
    listener.start()
    try:
        assert redis.wait_for(lambda: bool(redis.open()), WAIT_S)
        assert redis.open()[0].channels == {cancel_channel(PREFIX)}
    finally:
        listener.stop()


def test_a_lost_connection_is_subscribed_again(redis: MemoryPubSub, heard: Heard) -> None:
    [first] = redis.open()
    redis.drop()
    assert redis.wait_for(lambda: first.closed and len(redis.open()) == 1, WAIT_S)
    [second] = redis.open()
    assert second.channels == first.channels
    _cancel(redis, "job_3")
    heard.wait_for(lambda: heard.cancelled)
    assert heard.cancelled == [["job_3"]]
