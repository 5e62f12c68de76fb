"""The one rule for threads: an unexpected exception ends the process, loudly. Each case
runs in a process of its own, since that is what the rule ends. And the one place a
process's side threads start and stop: in order, and in the reverse order."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from inferq.host.supervision import EXIT_THREAD_DIED, SideThreads, SupervisedThread

CASES = {
    "side thread": """
        import time
        from inferq.host import supervision
        class Writer(supervision.SupervisedThread):
            thread_name = "result-writer"
            def _run(self):
                raise ValueError("the writer's bug")
        Writer().start()
        time.sleep(30)
    """,
    "thread": """
        import threading, time
        from inferq.host import supervision
        def work():
            raise ValueError("the writer's bug")
        supervision.thread(work, name="result-writer").start()
        time.sleep(30)
    """,
    "asyncio task": """
        import asyncio
        from inferq.host import supervision
        async def work():
            raise ValueError("the waiter's bug")
        async def main():
            supervision.watch_task(asyncio.create_task(work(), name="job-waiter"))
            await asyncio.sleep(30)
        asyncio.run(main())
    """,
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unexpected_exception_ends_the_process_with_its_traceback(case: str) -> None:
    code = "import logging; logging.basicConfig()\n" + textwrap.dedent(CASES[case])
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == EXIT_THREAD_DIED, done.stderr
    assert "died of an unexpected error" in done.stderr
    assert "ValueError: the" in done.stderr  # the traceback, not only the message


def test_a_thread_that_ends_normally_or_is_cancelled_is_no_failure() -> None:
    code = textwrap.dedent("""
        import asyncio
        from inferq.host import supervision
        supervision.thread(lambda: None, name="quiet", daemon=False).start()
        async def main():
            task = supervision.watch_task(asyncio.create_task(asyncio.sleep(30)))
            await asyncio.sleep(0)
            task.cancel()
            await asyncio.sleep(0.1)
        asyncio.run(main())
    """)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


class Piece:
    """A side thread that only records its calls."""

    def __init__(self, name: str, calls: list[str], *, fails: bool = False) -> None:
        self._name, self._calls, self._fails = name, calls, fails

    def start(self) -> None:
        if self._fails:
            raise RuntimeError(f"{self._name} cannot start")
        self._calls.append(f"start {self._name}")

    def stop(self) -> None:
        self._calls.append(f"stop {self._name}")


def test_side_threads_start_in_order_and_stop_in_the_reverse_order_once() -> None:
    calls: list[str] = []
    threads = SideThreads(*(Piece(name, calls) for name in ("writer", "loop", "feeder")))
    threads.start()
    threads.stop()
    threads.stop()
    assert calls == [
        "start writer",
        "start loop",
        "start feeder",
        "stop feeder",
        "stop loop",
        "stop writer",
    ]


def test_only_the_side_threads_started_are_stopped() -> None:
    calls: list[str] = []
    threads = SideThreads(Piece("writer", calls), Piece("loop", calls, fails=True))
    with pytest.raises(RuntimeError):
        threads.start()
    threads.stop()
    assert calls == ["start writer", "stop writer"]


class Waiting(SupervisedThread):
    """Waits on `_stopping`, or (with `wake`) on an event of its own that `_wake` sets."""

    thread_name = "waiting"

    def __init__(self, *, own_event: bool) -> None:
        self.own = threading.Event() if own_event else None
        self.ended = threading.Event()
        super().__init__()

    def _wake(self) -> None:
        if self.own is not None:
            self.own.set()

    def _run(self) -> None:
        (self.own or self._stopping).wait(60)
        self.ended.set()


@pytest.mark.parametrize("own_event", [False, True])
def test_stop_ends_a_supervised_thread_and_waits_for_it(own_event: bool) -> None:
    waiting = Waiting(own_event=own_event)
    waiting.start()
    waiting.stop(timeout_s=10)
    assert waiting.ended.is_set()
    assert not [t for t in threading.enumerate() if t.name == "waiting"]
