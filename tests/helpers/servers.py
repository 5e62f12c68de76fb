"""Throwaway Redis and PostgreSQL servers, for tests that flush, kill or restart them."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import psycopg
import redis

from tests.helpers.processes import free_port


class RedisServer:
    """A Redis of its own that keeps nothing on disk: stopped and started again (on the same
    port), it comes back empty, as a Redis restarted without persistence does."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        self.process = subprocess.Popen(
            [*argv, "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, started."""
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.kill()


def _pg_bin(name: str) -> str:
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    found = shutil.which(name) or (str(versions[-1] / name) if versions else None)
    assert found, f"PostgreSQL's {name} is needed"
    return found


class PostgresServer:
    """A PostgreSQL cluster in a directory of its own, run as the `postgres` user (the
    server refuses root, and cannot enter pytest's root-only temporary directories)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.data = workdir / "pgdata"
        self.socket_dir = workdir
        shutil.chown(workdir, "postgres", "postgres")
        workdir.chmod(0o700)
        self._as_postgres(_pg_bin("initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres")

    def _as_postgres(self, *argv: str) -> None:
        subprocess.run(
            ["runuser", "-u", "postgres", "--", *argv],
            check=True,
            capture_output=True,
            timeout=120,
        )

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1"
        self._as_postgres(
            _pg_bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-w",
            "-l",
            str(self.data / "server.log"),
            "start",
        )

    def stop(self, *, mode: str = "fast") -> None:
        """`fast`: a clean shutdown; `immediate`: as a crash (no checkpoint, recovery at
        the next start)."""
        self._as_postgres(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    workdir = Path(tempfile.mkdtemp(prefix="inferq-test-pg-"))
    try:
        server = PostgresServer(workdir)
        server.start()
        try:
            yield server
        finally:
            with suppress(subprocess.CalledProcessError):
                server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
