"""What the store tests share: a database on Postgres and on SQLite (`inferq run`'s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferq.store.migrate import upgrade
from tests.helpers.clock import Clock


@pytest.fixture(params=["postgres", "sqlite"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of the test's own: Postgres, then SQLite."""
    if request.param == "postgres":
        return str(request.getfixturevalue("database_url"))
    url = f"sqlite:///{tmp_path / 'store.db'}"
    upgrade(url)
    return url


@pytest.fixture
def clock() -> Clock:
    return Clock()
