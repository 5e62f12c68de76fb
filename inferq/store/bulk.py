"""Writing many rows at once. On PostgreSQL: COPY to insert (several times faster than
INSERT for the thousands of job rows a batch file makes) and one `UPDATE ... FROM
unnest(...)` statement to update (one round trip and one plan for hundreds of results,
where an executemany runs an UPDATE per row). Elsewhere (SQLite) plain multi-row
statements."""

from __future__ import annotations

import functools
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from psycopg import sql
from sqlalchemy import JSON, Column, Dialect, Table, insert, update
from sqlalchemy.orm import DeclarativeBase, Session

from inferq.store import text_codec


def insert_rows(
    session: Session, model: type[DeclarativeBase], rows: Sequence[dict[str, Any]]
) -> None:
    """Insert `rows` (dicts keyed by `model`'s attribute names, all with the same keys)
    in the session's transaction."""
    if not rows:
        return
    if session.get_bind().dialect.name != "postgresql":
        session.execute(insert(model), list(rows))
        return
    attributes = list(rows[0])
    columns = _columns(model, attributes)
    encoders = [_encoder(column) for column in columns]
    names = ", ".join(f'"{column.name}"' for column in columns)
    raw = session.connection().connection.driver_connection
    assert raw is not None
    statement = f'COPY "{_table(columns).name}" ({names}) FROM STDIN'
    with raw.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            copy.write_row(
                [
                    row[name] if encode is None else encode(row[name])
                    for name, encode in zip(attributes, encoders, strict=True)
                ]
            )


def update_rows(
    session: Session, model: type[DeclarativeBase], rows: Sequence[dict[str, Any]]
) -> None:
    """Update rows by primary key in the session's transaction: each dict holds the key
    and the attributes to set; attributes a dict leaves out are left as they are."""
    if not rows:
        return
    if session.get_bind().dialect.name != "postgresql":
        session.execute(update(model), list(rows))
        return
    update_rows_where(session, model, rows, condition="TRUE", returning=())


def update_rows_where(
    session: Session,
    model: type[DeclarativeBase],
    rows: Sequence[dict[str, Any]],
    *,
    condition: str,
    condition_params: Sequence[Any] = (),
    returning: Sequence[str],
) -> list[Any]:
    """On PostgreSQL only: `update_rows`, each row only where `condition` (SQL on the
    table as `t`, with `condition_params` for its placeholders) holds, returning the
    `returning` columns of the rows updated. One statement for every
    set of attributes the rows have: a lock taken in `condition` is taken before any row
    is updated."""
    by_attributes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_attributes[tuple(row)].append(row)
    (key,) = (column.name for column in model.__mapper__.primary_key)
    updated: list[Any] = []
    for attributes, group in by_attributes.items():
        updated += _update_group(
            session,
            model,
            group,
            key=key,
            attributes=attributes,
            condition=condition,
            condition_params=condition_params,
            returning=tuple(returning),
        )
    return updated


def _update_group(
    session: Session,
    model: type[DeclarativeBase],
    rows: list[dict[str, Any]],
    *,
    key: str,
    attributes: tuple[str, ...],
    condition: str,
    condition_params: Sequence[Any],
    returning: tuple[str, ...],
) -> list[Any]:
    columns = _columns(model, attributes)
    arrays = []
    for name, column in zip(attributes, columns, strict=True):
        encode = _encoder(column)
        values = [row[name] for row in rows]
        if encode is not None:
            values = [encode(value) for value in values]
        arrays.append(values)
    statement = _update_statement(
        model,
        key,
        attributes,
        dialect=session.get_bind().dialect,
        condition=condition,
        returning=returning,
    )
    # Through SQLAlchemy's connection, which hands the text to psycopg as it is, so that
    # a lost connection is seen as one (and renewed) like any other statement's.
    result = session.connection().exec_driver_sql(statement, (*arrays, *condition_params))
    return list(result.all()) if returning else []


@functools.cache
def _update_statement(
    model: type[DeclarativeBase],
    key: str,
    attributes: tuple[str, ...],
    *,
    dialect: Dialect,
    condition: str,
    returning: tuple[str, ...],
) -> str:
    """The `UPDATE ... FROM unnest(...)` of `attributes`, composed once per set of them (a
    writer's flush of one result spent a third of its CPU composing it), as text: psycopg
    would otherwise render a composed statement again at every execution (a fifth of a
    one-result flush), where it parses a text one once."""
    columns = _columns(model, attributes)
    statement = sql.SQL(
        "UPDATE {table} AS t SET {assignments} FROM unnest({arrays}) AS v({names}) "
        "WHERE t.{key} = v.{key} AND ({condition})"
    ).format(
        table=sql.Identifier(_table(columns).name),
        assignments=sql.SQL(", ").join(
            sql.SQL("{name} = v.{name}").format(name=sql.Identifier(column.name))
            for column in columns
            if column.name != key
        ),
        # The element types come from the model, never from the rows.
        arrays=sql.SQL(", ").join(
            sql.SQL("%s::{type}[]").format(type=sql.SQL(column.type.compile(dialect=dialect)))
            for column in columns
        ),
        names=sql.SQL(", ").join(sql.Identifier(column.name) for column in columns),
        key=sql.Identifier(key),
        condition=sql.SQL(condition),
    )
    if returning:
        statement = sql.SQL("{} RETURNING {}").format(
            statement, sql.SQL(", ").join(sql.Identifier("t", name) for name in returning)
        )
    return statement.as_string(None)


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
