"""What vLLM's engine processes print while the engine starts, held back until it is up.

When vLLM's engine core fails to start, the parent only learns "Engine core initialization
failed. See root cause above": the cause is in the child processes' output, inside a
hundred lines of traceback. So while the engine starts, file descriptors 1 and 2 (which the
children inherit) are pipes read by threads. If the engine comes up, everything held is
written where it was going and the threads go on copying (the children keep the pipes for
life). If it does not, the output goes to the debug log and `root_cause` picks the line that
says why, for a one-line error.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from types import TracebackType

from inferq.host import supervision

_ERROR_LINE = re.compile(r"\b((?:[A-Za-z_][\w.]*)?(?:Error|Exception)): (.+)$")
# The parent's (and the engine core's) own words for a failed start: never the cause.
_NOT_A_CAUSE = (
    "Engine core initialization failed",
    "See root cause above",
    "WorkerProc initialization failed",
    "See stack trace for root cause",
)


def root_cause(output: str) -> str | None:
    """The last `SomeError: message` line in vLLM's output that is not the parent's summary."""
    causes = []
    for line in output.splitlines():
        match = _ERROR_LINE.search(line)
        if match and not any(text in line for text in _NOT_A_CAUSE):
            causes.append(f"{match.group(1).rsplit('.', 1)[-1]}: {match.group(2).strip()}")
    return causes[-1] if causes else None


def start_failure(exc: BaseException, output: str) -> str:
    """Why the engine did not start, in one line: the child's error when the parent only
    knows that one happened, else the parent's own."""
    if any(text in str(exc) for text in _NOT_A_CAUSE):
        cause = root_cause(output)
        if cause:
            return cause
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:400]}"


class _CapturedFd:
    """One file descriptor replaced by a pipe, whose reader keeps or passes on what comes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.chunks: list[bytes] = []
        self.passing = False
        self.lock = threading.Lock()
        self.saved = os.dup(fd)
        read_fd, write_fd = os.pipe()
        os.dup2(write_fd, fd)
        os.close(write_fd)
        self.reader = supervision.thread(self._copy, args=(read_fd,), name=f"engine-output-{fd}")
        self.reader.start()

    def restore(self) -> None:
        os.dup2(self.saved, self.fd)

    def pass_on(self) -> None:
        with self.lock:
            self.passing = True
            held, self.chunks = b"".join(self.chunks), []
        self._write(held)

    def _copy(self, read_fd: int) -> None:
        while chunk := os.read(read_fd, 65536):
            with self.lock:
                if not self.passing:
                    self.chunks.append(chunk)
                    continue
            self._write(chunk)
        os.close(read_fd)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.saved, view) :]


class CapturedOutput:
    """`with CapturedOutput() as captured:` stdout and stderr (vLLM logs to stdout, Python
    prints tracebacks to stderr) are captured for the block, for this process and the
    processes it starts; then `pass_on()` passes them on, or `text()` returns them."""

    def __init__(self) -> None:
        self._fds: list[_CapturedFd] = []

    def __enter__(self) -> CapturedOutput:
        sys.stdout.flush()
        sys.stderr.flush()
        self._fds = [_CapturedFd(1), _CapturedFd(2)]
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd in self._fds:
            fd.restore()  # this process writes where it did before

    def pass_on(self) -> None:
        """Pass on what was captured, and whatever comes after (the engine's processes keep
        the pipes for life)."""
        for fd in self._fds:
            fd.pass_on()

    def text(self, *, wait_s: float = 5.0) -> str:
        """What was captured; waits up to `wait_s` for the processes that hold the pipes to
        end (a failed start's last words may still be in them)."""
        deadline = time.monotonic() + wait_s
        parts = []
        for fd in self._fds:
            fd.reader.join(max(0.0, deadline - time.monotonic()))
            with fd.lock:
                parts.append(b"".join(fd.chunks).decode(errors="replace"))
        return "\n".join(parts)
