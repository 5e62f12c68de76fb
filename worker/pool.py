"""The GPU worker's Celery pool: no thread waits on a message.

A message's task runs in Celery's consumer thread, where it asks for its jobs at the
door (worker/gpu_worker.py) and returns at once. The pool keeps the task's report back
until those jobs have ended and makes it from the thread that ended the last one (the
writer's, after the commit): Celery then acknowledges the message, or puts it back if
its jobs were given back. A message with nothing to wait on (a batch's wake-up, a
refused message) is reported at once. Celery still sees every message as a task
received, started and finished, and a warm shutdown waits for the reports kept back."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from billiard.einfo import ExceptionInfo
from celery.concurrency.base import BasePool
from celery.exceptions import Reject

log = logging.getLogger(__name__)

# How a task tells the pool to hold its report: `wait(done)` calls `done(returned)`
# once the message's jobs have ended.
Wait = Callable[[Callable[[bool], None]], None]


class Handoff:
    """The waits of the tasks running now, by task id: the task puts its wait here, the
    pool takes it once the task has returned (both in the consumer's thread)."""

    def __init__(self) -> None:
        self._waits: dict[str, Wait] = {}

    def put(self, task_id: str, wait: Wait) -> None:
        self._waits[task_id] = wait

    def take(self, task_id: str | None) -> Wait | None:
        return None if task_id is None else self._waits.pop(task_id, None)


class DoorPool(BasePool):  # type: ignore[misc]
    """Runs each task in the calling thread; reports a task that handed a wait over
    when that wait ends (see the module's doc). `handoff` is set by `door_pool`."""

    handoff: Handoff
    signal_safe = False
    body_can_be_buffer = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held = 0
        self._reported = threading.Condition()

    def on_apply(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        *,
        callback: Callable[[Any], None],
        accept_callback: Callable[[int, float], None] | None = None,
        correlation_id: str | None = None,
        **_: Any,
    ) -> None:
        started = time.monotonic()
        if accept_callback is not None:
            accept_callback(os.getpid(), started)
        # Celery's tracer: what the task raised comes back in its result, never here.
        result = target(*(args or ()), **(kwargs or {}))
        wait = self.handoff.take(correlation_id)
        if wait is None:
            callback(result)
            return
        with self._reported:
            self._held += 1

        def done(returned: bool) -> None:
            try:
                callback(_outcome(result, returned, time.monotonic() - started))
            finally:
                with self._reported:
                    self._held -= 1
                    self._reported.notify_all()

        wait(done)

    def on_stop(self) -> None:
        """A warm shutdown: wait for the messages held (the drain ends their jobs)."""
        with self._reported:
            while self._held:
                self._reported.wait()
        super().on_stop()

    def _get_info(self) -> dict[str, Any]:
        info: dict[str, Any] = super()._get_info()
        info.update({"max-concurrency": self.limit, "held": self._held})
        return info


def door_pool(handoff: Handoff) -> type[DoorPool]:
    """The pool class for Celery's `worker_pool`, reporting the waits put in `handoff`."""
    return type("DoorPool", (DoorPool,), {"handoff": handoff})


def _outcome(result: Any, returned: bool, runtime_s: float) -> tuple[int, Any, float]:
    """What Celery's tracer would have returned had the task waited: success, with the
    wait's runtime, or a `Reject` that puts the message back."""
    if not returned:
        failed, value, _ = result
        return failed, value, runtime_s
    try:
        raise Reject("its jobs went back to the queue", requeue=True)
    except Reject:
        return 1, ExceptionInfo(internal=True), runtime_s
