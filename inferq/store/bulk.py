"""Inserting many rows at once. On PostgreSQL: COPY (faster than INSERT for the thousands
of job rows a batch file makes). Elsewhere (SQLite) a plain multi-row
statement."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from sqlalchemy import JSON, Column, Table, insert
from sqlalchemy.orm import DeclarativeBase, Session

from inferq.store import text_codec
from inferq.store.dialects import on_postgres


def insert_rows(
    session: Session, model: type[DeclarativeBase], rows: Sequence[dict[str, Any]]
) -> None:
    """Insert `rows` (dicts keyed by `model`'s attribute names, all with the same keys)
    in the session's transaction."""
    if not rows:
        return
    if not on_postgres(session):
        session.execute(insert(model), list(rows))
        return
    raw = session.connection().connection.driver_connection
    assert raw is not None
    copy_rows(raw, model, rows)


def copy_rows(
    driver: psycopg.Connection[Any], model: type[DeclarativeBase], rows: Sequence[dict[str, Any]]
) -> None:
    """Insert `rows` (as `insert_rows` takes them) by COPY on psycopg's connection `driver`:
    in its transaction, or (in autocommit) all of them or none, as one command."""
    attributes = list(rows[0])
    columns = _columns(model, attributes)
    encoders = [_encoder(column) for column in columns]
    names = ", ".join(f'"{column.name}"' for column in columns)
    statement = f'COPY "{_table(columns).name}" ({names}) FROM STDIN'
    with driver.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(
                [
                    row[name] if encode is None else encode(row[name])
                    for name, encode in zip(attributes, encoders, strict=True)
                ]
            )


def _encoder(column: Column[Any]) -> Callable[[Any], str | None] | None:
    """What the column's type does to a value on the way in, which COPY and the arrays
    of `update_rows` must do by hand (`inferq.store.text_codec`)."""
    if isinstance(column.type, JSON):
        return text_codec.dumps  # None too: JSON null, as the ORM stores it
    if isinstance(column.type, text_codec.StoredText):
        return text_codec.escape_optional
    return None


def _columns(model: type[DeclarativeBase], attributes: Sequence[str]) -> list[Column[Any]]:
    mapper = model.__mapper__
    return [mapper.attrs[name].columns[0] for name in attributes]


def _table(columns: Sequence[Column[Any]]) -> Table:
    table = columns[0].table
    assert isinstance(table, Table)
    return table
