"""Throwaway Postgres databases: one migrated template per run, cheap clones per test."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql

from inferq.store.migrate import upgrade

ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def sqlalchemy_url(name: str, *, host: str = "127.0.0.1", port: int = 5432) -> str:
    return f"postgresql+psycopg://postgres@{host}:{port}/{name}"


def _admin(statement: sql.Composable, dsn: str = ADMIN_DSN) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(statement)


def create_database(name: str, *, template: str | None = None, dsn: str = ADMIN_DSN) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template:
        statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(template)
        )
    _admin(statement, dsn)


def drop_database(name: str, *, dsn: str = ADMIN_DSN) -> None:
    _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)), dsn)


@contextmanager
def migrated_template() -> Iterator[str]:
    """A database at the head revision, to clone; dropped at the end."""
    name = f"inferq_test_{secrets.token_hex(4)}_tpl"
    create_database(name)
    try:
        upgrade(sqlalchemy_url(name))
        yield name
    finally:
        drop_database(name)


@contextmanager
def cloned_database(template: str) -> Iterator[str]:
    """A fresh database with the schema; dropped at the end. Returns its SQLAlchemy URL."""
    name = f"{template.removesuffix('_tpl')}_{secrets.token_hex(4)}"
    create_database(name, template=template)
    try:
        yield sqlalchemy_url(name)
    finally:
        drop_database(name)
