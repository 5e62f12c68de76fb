"""The one place that tells the store's two databases apart: PostgreSQL (the service) and
SQLite (`inferq run`, one process). A store asks once, when it is built; an operation
whose SQL differs between them (the claim, the flush) keeps its two variants side by side
in a module named for it (`inferq/store/claim.py`, `inferq/store/flush.py`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

POSTGRES = "postgresql"


def on_postgres(bind: Engine | Connection | Session | str) -> bool:
    """Whether `bind` (or the dialect so named) is PostgreSQL; if not, it is SQLite."""
    if isinstance(bind, str):
        return bind == POSTGRES
    if isinstance(bind, Session):
        return bind.get_bind().dialect.name == POSTGRES
    return bind.dialect.name == POSTGRES


def conflict_insert(table: Any, *, postgres: bool) -> Any:
    """`INSERT` into `table` in the dialect's own form, which has `ON CONFLICT`
    (`on_conflict_do_nothing`, `on_conflict_do_update`, `excluded`)."""
    return (postgresql if postgres else sqlite).insert(table)
