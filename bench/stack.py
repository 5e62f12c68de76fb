"""A throwaway inferq deployment for benchmarks: its own Postgres database, Redis key
prefix and processes, started from the same entry points as production and the tests."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import redis
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from cli.demo_model import TINY, DemoShape, build_demo_model
from inferq.store.migrate import upgrade

ADMIN_DSN = os.environ.get("BENCH_ADMIN_DSN", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
ADMIN_KEY = "iq_bench_" + secrets.token_hex(16)
MODEL_NAME = "bench-model"
CACHE = Path(os.environ.get("INFERQ_TEST_CACHE", Path.home() / ".cache" / "inferq-tests"))


def demo_model(shape: DemoShape = TINY, name: str = "tiny") -> Path:
    return build_demo_model(CACHE / name, shape)


@contextmanager
def stopped_on_sigterm() -> Iterator[None]:
    """While it lasts, SIGTERM (`kill`, `timeout`, a CI's stop) unwinds the bench as Ctrl-C
    does, so that the servers and processes it started, each in a session of its own, are
    stopped rather than left running; a second SIGTERM does not cut that short. Outside
    the main thread (where Python runs signal handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        # Unwinding from a SIGTERM (ignored now): an enclosing one's handler stays off too.
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_IGN:
            signal.signal(signal.SIGTERM, previous)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextmanager
def database(admin_dsn: str = ADMIN_DSN) -> Iterator[str]:
    """A new, migrated database on the server `admin_dsn` reaches; dropped afterwards."""
    name = "inferq_bench_" + secrets.token_hex(4)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    server = conninfo_to_dict(admin_dsn)
    url = f"postgresql+psycopg://postgres@{server['host']}:{server.get('port', 5432)}/{name}"
    try:
        upgrade(url)
        yield url
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@contextmanager
def key_prefix(redis_url: str = REDIS_URL) -> Iterator[str]:
    prefix = f"bench-{secrets.token_hex(4)}:"
    try:
        yield prefix
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=prefix + "*", count=1000))
        if keys:
            client.delete(*keys)


def service_env(
    *, model: Path, database_url: str, prefix: str, redis_url: str = REDIS_URL, **extra: str
) -> dict[str, str]:
    return {
        **os.environ,
        "INFERQ_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        "INFERQ_RATE_LIMIT_RPM": "0",
        "INFERQ_RATE_LIMIT_TPM": "0",
        "INFERQ_DATABASE_URL": database_url,
        "INFERQ_REDIS_URL": redis_url,
        "INFERQ_REDIS_KEY_PREFIX": prefix,
        "INFERQ_MODEL": str(model),
        "INFERQ_SERVED_MODEL_NAME": MODEL_NAME,
        **extra,
    }


class Process:
    """One inferq entry point, in its own process group, its output in a log file."""

    def __init__(self, argv: list[str], *, env: Mapping[str, str], log: Path) -> None:
        self.log = log
        self.env = dict(env)
        self._out = log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "cli.main", *argv],
            env=dict(env),
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_for(self, ready: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while ready not in self.log.read_text(errors="replace"):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.log.name} did not start:\n{self.log.read_text()}")
            time.sleep(0.2)

    def peak_rss_mb(self) -> float:
        """The process's peak resident memory (VmHWM), in MiB."""
        for line in Path(f"/proc/{self.popen.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError("no VmHWM in /proc status")

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait()
        self._out.close()


@contextmanager
def api(env: Mapping[str, str], log_dir: Path) -> Iterator[tuple[Process, str]]:
    port = free_port()
    process = Process(["api"], env={**env, "INFERQ_API_PORT": str(port)}, log=log_dir / "api.log")
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the API did not start:\n{process.log.read_text()}")
            time.sleep(0.2)
        yield process, url
    finally:
        process.stop()


@dataclass(frozen=True)
class Deployment:
    """A running deployment: the API's URL, the processes' environment (database, key
    prefix), and its processes (for their CPU, say)."""

    url: str
    env: dict[str, str]
    api: Process
    workers: list[Process]
    service: Process
    beat: Process

    @property
    def worker(self) -> Process:
        """The first GPU worker (the only one, unless more were asked for)."""
        return self.workers[0]


@contextmanager
def deployment(
    model: Path,
    workdir: Path,
    *,
    workers: int = 1,
    admin_dsn: str = ADMIN_DSN,
    redis_url: str = REDIS_URL,
    **extra: str,
) -> Iterator[Deployment]:
    """API, `workers` GPU workers, delivery/maintenance worker and beat on a database of
    their own, stopped at the end (on SIGTERM too)."""
    with ExitStack() as cleanup:
        cleanup.enter_context(stopped_on_sigterm())
        url = cleanup.enter_context(database(admin_dsn))
        prefix = cleanup.enter_context(key_prefix(redis_url))
        env = service_env(
            model=model, database_url=url, prefix=prefix, redis_url=redis_url, **extra
        )
        api_process, base_url = cleanup.enter_context(api(env, workdir))
        gpu_workers = []
        for i in range(workers):
            worker_env = {**env, "INFERQ_WORKER_METRICS_PORT": str(free_port())}
            suffix = "" if workers == 1 else f"-{i}"
            worker = Process(
                ["worker", "--name", f"bench{suffix}@host"],
                env=worker_env,
                log=workdir / f"worker{suffix}.log",
            )
            cleanup.callback(worker.stop)
            gpu_workers.append(worker)
        service = Process(
            ["webhooks", "--name", "service@host"], env=env, log=workdir / "service.log"
        )
        cleanup.callback(service.stop)
        beat = Process(["beat"], env=env, log=workdir / "beat.log")
        cleanup.callback(beat.stop)
        for worker in gpu_workers:
            worker.wait_for(" ready.", timeout_s=600)
        service.wait_for(" ready.", timeout_s=120)
        yield Deployment(
            url=base_url,
            env=env,
            api=api_process,
            workers=gpu_workers,
            service=service,
            beat=beat,
        )
