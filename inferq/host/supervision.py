"""One rule for every long-lived thread, pool task and asyncio task of an inferq process:
an exception nobody planned for is logged with its traceback, and the process exits with
`EXIT_THREAD_DIED`.

A thread is never restarted in its place: nothing proves that what it shared (held jobs,
room at the door, results half written) is consistent. A process that exits lets its
leases lapse and its unacknowledged messages go back to Redis, and its supervisor starts
a fresh one.

    thread(self._run, name="result-writer")  # instead of threading.Thread
    watch_task(asyncio.create_task(...))      # the API's long-lived tasks"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

log = logging.getLogger(__name__)

EXIT_THREAD_DIED = 71


def died(name: str, exc: BaseException) -> None:
    """The one policy: log the traceback, then end the process at once (not through
    `sys.exit`, which a thread cannot do, nor atexit, which could wait on the dead)."""
    log.critical(
        "%s died of an unexpected error; the process exits (%d) so that it is restarted "
        "and its jobs go to other workers",
        name,
        EXIT_THREAD_DIED,
        exc_info=exc,
    )
    logging.shutdown()
    os._exit(EXIT_THREAD_DIED)


def supervised(target: Callable[..., object], *, name: str) -> Callable[..., None]:
    """`target`, ending the process if it raises."""

    def run(*args: Any) -> None:
        try:
            target(*args)
        except BaseException as exc:  # noqa: BLE001 - the one place that catches everything
            died(f"thread {name}", exc)

    return run


def thread(
    target: Callable[..., object], *, name: str, args: tuple[Any, ...] = (), daemon: bool = True
) -> threading.Thread:
    """A thread running `target` under the rule."""
    return threading.Thread(
        target=supervised(target, name=name), args=args, name=name, daemon=daemon
    )


class SupervisedThread:
    """A long-lived thread under the rule, whose start and stop are written once: `start`
    runs `_run` in it; `stop` sets `_stopping`, calls `_wake` (for a thread that waits on
    something else) and waits up to `stop_timeout_s` for the thread to end."""

    thread_name: ClassVar[str]
    stop_timeout_s: ClassVar[float] = 5.0

    def __init__(self) -> None:
        self._stopping = threading.Event()
        self._thread = thread(self._run, name=self.thread_name)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        self._stopping.set()
        self._wake()
        self._thread.join(self.stop_timeout_s if timeout_s is None else timeout_s)

    def _wake(self) -> None:
        """Make `_run` see `_stopping` now (nothing to do if it waits on `_stopping`)."""

    def _run(self) -> None:
        raise NotImplementedError


class Startable(Protocol):
    def start(self) -> None: ...

    def stop(self) -> None: ...


class SideThreads:
    """A process's long-lived threads, started in one place in the order given and stopped
    in the reverse order, each stop returning before the next: what was started last
    (which feeds what came before) stops first. Only those started are stopped."""

    def __init__(self, *threads: Startable) -> None:
        self._threads = threads
        self._started: list[Startable] = []

    def start(self) -> None:
        for side in self._threads:
            side.start()
            self._started.append(side)

    def stop(self) -> None:
        while self._started:
            self._started.pop().stop()


def watch_task(task: asyncio.Task[Any]) -> asyncio.Task[Any]:
    """A long-lived asyncio task under the rule (cancelling it at shutdown is not a
    failure)."""

    def check(done: asyncio.Task[Any]) -> None:
        if not done.cancelled() and (exc := done.exception()) is not None:
            died(f"task {done.get_name()}", exc)

    task.add_done_callback(check)
    return task
