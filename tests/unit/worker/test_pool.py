"""The GPU worker's Celery pool: a task that hands a wait over is reported done when the
wait ends, not when it returns; a warm shutdown waits for those reports."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from celery.exceptions import Reject

from worker.pool import Handoff, door_pool

WAIT_S = 10


class _Message:
    """A task's run through the pool, as Celery's consumer makes it: the tracer as target
    (it returns `(failed, value, runtime)`), and the callbacks Celery passes."""

    def __init__(self) -> None:
        self.accepted = threading.Event()
        self.reported: list[Any] = []
        self.done: Callable[[bool], None] | None = None

    def wait(self, done: Callable[[bool], None]) -> None:
        self.done = done

    def on_accepted(self, pid: int, time_accepted: float) -> None:
        self.accepted.set()


def _pool(handoff: Handoff) -> Any:
    pool = door_pool(handoff)(limit=4)
    pool.start()
    return pool


def _apply(pool: Any, message: _Message, *, hands_over: bool, task_id: str = "t1") -> None:
    def trace() -> tuple[int, str, float]:
        if hands_over:
            pool.handoff.put(task_id, message.wait)
        return 0, "None", 0.0

    pool.apply_async(
        trace,
        callback=message.reported.append,
        accept_callback=message.on_accepted,
        correlation_id=task_id,
    )


def test_a_task_that_hands_a_wait_over_is_reported_when_the_wait_ends() -> None:
    pool = _pool(Handoff())
    message = _Message()
    _apply(pool, message, hands_over=True)
    assert message.accepted.is_set()
    assert message.reported == []  # returned, but its jobs have not ended
    assert message.done is not None
    message.done(False)
    [(failed, value, runtime)] = message.reported
    assert (failed, value) == (0, "None")
    assert runtime > 0


def test_a_wait_whose_jobs_went_back_is_reported_as_a_requeueing_reject() -> None:
    pool = _pool(Handoff())
    message = _Message()
    _apply(pool, message, hands_over=True)
    assert message.done is not None
    message.done(True)
    [(failed, info, _)] = message.reported
    assert failed == 1
    rejected = info.exception.exc  # as Celery unwraps it from its traceback's wrapper
    assert isinstance(rejected, Reject)
    assert rejected.requeue


def test_a_task_with_nothing_to_wait_on_is_reported_at_once() -> None:
    pool = _pool(Handoff())
    message = _Message()
    _apply(pool, message, hands_over=False)
    assert message.reported == [(0, "None", 0.0)]


def test_a_warm_shutdown_waits_for_the_messages_held() -> None:
    pool = _pool(Handoff())
    message = _Message()
    _apply(pool, message, hands_over=True)
    stopped = threading.Thread(target=pool.stop)
    stopped.start()
    stopped.join(0.2)
    assert stopped.is_alive()  # still held
    assert message.done is not None
    message.done(False)
    stopped.join(WAIT_S)
    assert not stopped.is_alive()
    assert len(message.reported) == 1
