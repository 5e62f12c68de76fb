"""The bench's deployments stop what they started when the bench is told to stop: with
SIGTERM as with Ctrl-C, its servers and processes (each in a session of its own) are not
left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# A bench in miniature: a process of its own session started under `stopped_on_sigterm`,
# stopped (and reaped) as the bench unwinds.
BENCH = textwrap.dedent(
    """
    import subprocess, sys, time
    from bench.stack import stopped_on_sigterm

    with stopped_on_sigterm():
        child = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        try:
            print(child.pid, flush=True)
            time.sleep(600)
        finally:
            child.terminate()
            child.wait()
    """
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_what_the_bench_started() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", BENCH],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    ) as bench:
        assert bench.stdout is not None
        child = int(bench.stdout.readline())
        try:
            bench.send_signal(signal.SIGTERM)
            assert bench.wait(timeout=60) == 128 + signal.SIGTERM
            assert not _alive(child)
        finally:
            if _alive(child):
                os.kill(child, signal.SIGKILL)
