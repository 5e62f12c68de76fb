"""The migrations build exactly the schema the ORM rows describe."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect

from inferq.store.models import Base
from tests.helpers.databases import create_database, drop_database, sqlalchemy_url


def test_migrations_at_head_match_the_models(database_url: str) -> None:
    engine = create_engine(database_url)
    with engine.connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    engine.dispose()
    assert differences == []


def test_inferq_migrate_creates_the_schema_in_an_empty_database() -> None:
    name = f"inferq_test_{secrets.token_hex(4)}_empty"
    create_database(name)
    try:
        url = sqlalchemy_url(name)
        result = subprocess.run(
            [sys.executable, "-m", "cli.main", "migrate"],
            env={**os.environ, "INFERQ_DATABASE_URL": url},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert "database schema is at head" in result.stdout
        engine = create_engine(url)
        tables = set(inspect(engine).get_table_names())
        engine.dispose()
        assert set(Base.metadata.tables) <= tables
        assert "alembic_version" in tables
    finally:
        drop_database(name)
