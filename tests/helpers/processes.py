"""Starting inferq's real entry points as processes, and waiting until they serve."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import httpx

from tests.helpers import fork_server
from tests.helpers.faulty_worker import (
    DEAF_VARIABLE,
    DIE_ON_SIGUSR1_VARIABLE,
    RAISE_VARIABLE,
    SEED_VARIABLE,
)
from tests.helpers.fork_server import Forked

INFERQ = [sys.executable, "-m", "cli.main"]

# vLLM's engine core in the process that drives it (vLLM's multiprocessing off): on a CPU
# an engine then starts in ~24 s of CPU rather than ~55, as no core and model process are
# spawned to import torch and vLLM again. The default of the processes tests start; tests
# whose subject is the engine's own processes (a killed core, their nice) keep them apart.
ENGINE_CORE_HERE = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
ENGINE_CORE_APART = {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}
# The core apart, running the model itself (vLLM's one-process executor, named by its class
# so that vLLM on a CPU does not swap in its multiprocessing one): a core to kill, spawned
# as one process rather than two.
ONE_PROCESS_EXECUTOR = {
    "distributed_executor_backend": "vllm.v1.executor.uniproc_executor.UniProcExecutor"
}
ENGINE_CORE_ALONE = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    "INFERQ_ENGINE_EXTRA_ARGS": json.dumps(ONE_PROCESS_EXECUTOR),
}
# The same, with a fault hook in the engine (see there).
FAULTY_INFERQ = [sys.executable, "-m", "tests.helpers.faulty_worker"]


class ServiceProcess:
    """A child process with its output in a log file, shown when a test needs it."""

    def __init__(self, name: str, argv: list[str], *, env: Mapping[str, str], log_dir: Path):
        self.name = name
        self.metrics_url = ""
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        environment = {**os.environ, **env}
        # `python -m ...` is forked from a parent that has its libraries imported.
        forked = None
        if argv[:2] == [sys.executable, "-m"]:
            forked = fork_server.spawn(argv[2], argv[3:], env=environment, log=self.log_path)
        self.process: subprocess.Popen[bytes] | Forked = forked or subprocess.Popen(
            argv,
            env=environment,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def wait_until(self, ready: Callable[[], bool], *, timeout_s: float, what: str) -> None:
        """Until `ready()`; a process that exits first or is not ready in time is killed
        with everything it started (a start that failed leaks no process), and the error
        shows its log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                self.discard()
                raise RuntimeError(f"{self.name} exited early:\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.25)
        self.discard()
        raise TimeoutError(f"{self.name} not {what} after {timeout_s} s:\n{self.log_tail()}")

    def signal(self, signum: int) -> None:
        if self.alive():
            self.process.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        """Signal the process and everything it started: SIGSTOP freezes vLLM's engine core
        too, which otherwise goes on generating while its parent is stopped."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    @contextlib.contextmanager
    def frozen(self) -> Iterator[None]:
        """The process and its children stopped (SIGSTOP) until the block ends."""
        self.signal_group(signal.SIGSTOP)
        try:
            yield
        finally:
            self.signal_group(signal.SIGCONT)

    def kill_group(self) -> None:
        """SIGKILL the process and everything it started (vLLM's engine processes too)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def discard(self) -> None:
        """Kill the process and its children at once: for tearing down a test's deployment,
        whose graceful stop is no part of what the test checks (a GPU worker's takes
        seconds of vLLM's own shutdown wait; the graceful stop has tests of its own)."""
        self.kill_group()
        self._log.close()

    def stop(self, timeout_s: float = 30) -> None:
        if self.alive():
            self.signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout_s)
        self.kill_group()
        self._log.close()


def http_ok(url: str) -> Callable[[], bool]:
    def check() -> bool:
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    return check


def log_contains(process: ServiceProcess, text: str) -> Callable[[], bool]:
    return lambda: text in process.log_path.read_text(errors="replace")


def start_api(
    *, env: Mapping[str, str], port: int, log_dir: Path, name: str = "api"
) -> ServiceProcess:
    api = ServiceProcess(
        name, [*INFERQ, "api"], env={**env, "INFERQ_API_PORT": str(port)}, log_dir=log_dir
    )
    api.wait_until(http_ok(f"http://127.0.0.1:{port}/healthz"), timeout_s=60, what="serving")
    return api


def start_worker(
    *,
    env: Mapping[str, str],
    log_dir: Path,
    name: str = "worker",
    wait: bool = True,
    kill_engine_seed: int | None = None,
    raise_once: str | None = None,
    deaf_control: bool = False,
    die_on_sigusr1: bool = False,
) -> ServiceProcess:
    """A GPU worker; with `kill_engine_seed`, one whose engine core (a process of its own
    then) a request with that seed kills; with `raise_once`, one whose piece of that name
    raises once; with `deaf_control`, one that refuses to consume again when told; with
    `die_on_sigusr1`, one whose result writer's thread dies after each SIGUSR1 (all:
    tests/helpers/faulty_worker.py)."""
    env = {"INFERQ_WORKER_METRICS_PORT": str(free_port()), **env}
    command = INFERQ
    if kill_engine_seed is not None:
        command = FAULTY_INFERQ
        env = {**env, **ENGINE_CORE_ALONE, SEED_VARIABLE: str(kill_engine_seed)}
    if raise_once is not None:
        command = FAULTY_INFERQ
        env = {**env, RAISE_VARIABLE: raise_once}
    if deaf_control:
        command = FAULTY_INFERQ
        env = {**env, DEAF_VARIABLE: "1"}
    if die_on_sigusr1:
        command = FAULTY_INFERQ
        env = {**env, DIE_ON_SIGUSR1_VARIABLE: "1"}
    worker = ServiceProcess(
        name, [*command, "worker", "--name", f"{name}@test"], env=env, log_dir=log_dir
    )
    worker.metrics_url = f"http://127.0.0.1:{env['INFERQ_WORKER_METRICS_PORT']}/metrics"
    if wait:
        wait_worker_ready(worker)
    return worker


def wait_worker_ready(worker: ServiceProcess, timeout_s: float = 240) -> None:
    worker.wait_until(log_contains(worker, " ready."), timeout_s=timeout_s, what="consuming")


def thread_nices(pid: int) -> set[int]:
    """The nice value of each thread of `pid` (field 19 of its stat)."""
    nices = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            nices.add(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
    return nices


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def have(program: str) -> bool:
    return shutil.which(program) is not None
