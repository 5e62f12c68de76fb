"""The one rule for threads: an unexpected exception ends the process, loudly. Each case
runs in a process of its own, since that is what the rule ends."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from inferq.host.supervision import EXIT_THREAD_DIED

CASES = {
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
