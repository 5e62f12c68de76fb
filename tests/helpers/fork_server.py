"""A parent that imports torch, vLLM and the services' libraries once, and forks the inferq
processes the tests start, so that each skips the import: a GPU worker's start then costs
about 2 s of CPU rather than 11 (vLLM's import alone is about 9), an API's one rather than 2.

Only libraries are imported ahead, never inferq's own modules nor the tests' fault hooks:
those import in each child, after its environment is set, as they would in a process of
its own. A child is what `python -m MODULE ARGS` would be: its own session (so a process
group to signal), the module run as `__main__`, its output appended to its log, and the
environment it was given. Where that environment differs in a variable the libraries read
as they import (vLLM's logging, OpenMP's threads), the process is started the ordinary way
(`spawn` says which). `INFERQ_TEST_FORK_SERVER=0` starts every process the ordinary way.

The server is a child of the pytest process that first needs it, and ends with it. It
reaps its children and writes each one's exit status to `<pid>.rc` in its directory, which
`Forked` (the pytest process's handle, shaped like `subprocess.Popen`) reads.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import json
import os
import runpy
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Imported once in the server. A library missing here is skipped (the child imports what
# it needs); inferq's modules and tests.helpers.faulty_worker are never on this list.
LIBRARIES = (
    "torch",
    "transformers",
    "vllm",
    "vllm.entrypoints.llm",
    "vllm.v1.engine.core",
    "vllm.v1.engine.llm_engine",
    "vllm.v1.engine.core_client",
    "vllm.model_executor.models.llama",
    "celery",
    "celery.apps.worker",
    "celery.apps.beat",
    "celery.worker",
    "kombu",
    "redis",
    "sqlalchemy",
    "sqlalchemy.orm",
    "psycopg",
    "pydantic",
    "pydantic_settings",
    "fastapi",
    "starlette",
    "uvicorn",
    "sse_starlette",
    "httpx",
    "typer",
    "rich",
    "orjson",
    "prometheus_client",
)
# Variables the libraries above read as they import: a child whose value differs is
# started the ordinary way.
READ_AT_IMPORT = (
    "VLLM_LOGGING_LEVEL",
    "VLLM_CONFIGURE_LOGGING",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_LOGGING_PREFIX",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "TOKENIZERS_PARALLELISM",
    "HF_HOME",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "XDG_CACHE_HOME",
    "PYTHONPATH",
    "PROMETHEUS_MULTIPROC_DIR",
    "PYTHONHASHSEED",
)
# What the server imports with: the values the tests' processes run with (`service_env`).
SERVER_ENV = {"VLLM_LOGGING_LEVEL": "WARNING", "TOKENIZERS_PARALLELISM": "false"}


class Forked:
    """A process the server forked, as the pytest process sees it (`subprocess.Popen`'s
    `pid`, `returncode`, `poll`, `wait` and `send_signal`)."""

    def __init__(self, pid: int, status_dir: Path) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status = status_dir / f"{pid}.rc"

    def poll(self) -> int | None:
        if self.returncode is None and self._status.exists():
            self.returncode = int(self._status.read_text())
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0)
            time.sleep(0.02)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


class _Client:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="inferq-fork-server-"))
        self.socket_path = self.dir / "socket"
        self._lock = threading.Lock()
        # What the server imported with, which a child's environment is held against.
        self.env = {**os.environ, **SERVER_ENV}
        with (self.dir / "server.log").open("ab") as log:
            self.server = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.fork_server", str(self.dir)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        atexit.register(self.close)

    def spawn(self, module: str, args: list[str], env: Mapping[str, str], log: Path) -> Forked:
        request = {
            "module": module,
            "args": args,
            "env": dict(env),
            "log": str(log),
            "cwd": os.getcwd(),
        }
        with self._lock:
            deadline = time.monotonic() + 120
            while not self.socket_path.exists():
                if self.server.poll() is not None or time.monotonic() > deadline:
                    said = (self.dir / "server.log").read_text(errors="replace")[-4000:]
                    raise RuntimeError(f"the tests' fork server did not start:\n{said}")
                time.sleep(0.05)
            with socket.socket(socket.AF_UNIX) as connection:
                connection.connect(str(self.socket_path))
                connection.sendall(json.dumps(request).encode() + b"\n")
                answer = connection.makefile().readline()
        return Forked(int(json.loads(answer)["pid"]), self.dir)

    def close(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.server.kill()
        self.server.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


@functools.cache
def _client() -> _Client:
    return _Client()


def spawn(module: str, args: list[str], *, env: Mapping[str, str], log: Path) -> Forked | None:
    """`python -m module args` with `env` (the whole environment) and its output appended to
    `log`, forked from the server; None where it must start the ordinary way."""
    if os.environ.get("INFERQ_TEST_FORK_SERVER", "1") == "0":
        return None
    server = _client()
    if any(env.get(name) != server.env.get(name) for name in READ_AT_IMPORT):
        return None
    return server.spawn(module, args, env, log)


# The server.


def _serve(directory: Path) -> None:
    for name in LIBRARIES:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    parent = os.getppid()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(directory / ".socket"))
    listener.listen(16)
    # Announced once it can be connected to.
    os.rename(directory / ".socket", directory / "socket")
    while os.getppid() == parent:
        ready, _, _ = select.select([listener, wake_read], [], [], 1.0)
        if wake_read in ready:
            os.read(wake_read, 4096)
        _reap(directory)
        if listener in ready:
            connection, _ = listener.accept()
            with connection:
                request = json.loads(connection.makefile().readline())
                pid = os.fork()
                if pid == 0:
                    _child(request, [listener, connection], [wake_read, wake_write])
                # A pid used again: the status of its earlier process is not this one's.
                with contextlib.suppress(FileNotFoundError):
                    (directory / f"{pid}.rc").unlink()
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")


def _reap(directory: Path) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        (directory / f"{pid}.tmp").write_text(str(code))
        os.rename(directory / f"{pid}.tmp", directory / f"{pid}.rc")


def _child(request: dict[str, Any], sockets: list[socket.socket], fds: list[int]) -> None:
    """In the forked child: become `python -m module args`, and never return."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for one in sockets:
            one.close()
        for fd in fds:
            os.close(fd)
        for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log = os.open(str(request["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        # As PYTHONUNBUFFERED does for the process's own prints.
        sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(str(request["cwd"]))
        module = str(request["module"])
        sys.argv = [module, *request["args"]]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            if exit_.code is None or isinstance(exit_.code, int):
                code = exit_.code or 0
            else:
                print(exit_.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:  # as `python -m` ends on one: killed by SIGINT
            traceback.print_exc()
            _exit_as_the_interpreter_does()
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        except Exception:  # noqa: BLE001 - as an uncaught error ends `python -m`: its traceback, status 1
            traceback.print_exc()
            code = 1
        _exit_as_the_interpreter_does()
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _exit_as_the_interpreter_does() -> None:
    """What Python does as its main module ends: wait for the threads that are not daemons
    (a worker's drain returns its jobs from one), then run the atexit handlers."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
