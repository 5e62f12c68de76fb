"""The claim: jobs taken for a worker under a lease, queued ones and running ones whose
lease ran out, in one `UPDATE ... RETURNING` per dialect, side by side. The variants differ
only in how the ids are bound: one array on PostgreSQL, compiled once to the text psycopg
runs; an expanded list on SQLite. The store picks one (`inferq/store/dialects.py`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from sqlalchemy import (
    ColumnElement,
    Connection,
    Dialect,
    String,
    Update,
    and_,
    any_,
    bindparam,
    or_,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY

from inferq.domain.jobs import JobStatus
from inferq.store.base import DriverStatement
from inferq.store.dialects import on_postgres
from inferq.store.job_rows import CLAIMED_COLUMNS
from inferq.store.models import JobRow, Timestamp


def _claim(ids: ColumnElement[bool]) -> Update:
    """The claim of the jobs whose ids `ids` matches: queued ones, and running ones
    whose lease ran out."""
    return (
        update(JobRow)
        .where(
            ids,
            or_(
                JobRow.status == JobStatus.QUEUED.value,
                and_(
                    JobRow.status == JobStatus.RUNNING.value,
                    JobRow.lease_expires_at < bindparam("claim_now", type_=Timestamp),
                ),
            ),
        )
        .values(
            status=JobStatus.RUNNING.value,
            worker=bindparam("claim_worker"),
            started_at=bindparam("claim_now", type_=Timestamp),
            lease_expires_at=bindparam("claim_lease_until", type_=Timestamp),
            attempts=JobRow.attempts + 1,
        )
        .returning(*CLAIMED_COLUMNS)
    )


# Both built once: a claim is the worker's hottest statement (one a task), and compiling
# it through an ORM session each time would cost more than the round trip. On PostgreSQL,
# compiled once to psycopg's text with the ids as one array, so that no claim renders its
# list of ids into the statement again.
_ON_POSTGRES = DriverStatement(_claim(JobRow.id == any_(bindparam("ids", type_=ARRAY(String)))))
_ON_SQLITE = _claim(JobRow.id.in_(bindparam("ids", expanding=True)))


def claim_on_postgres(
    driver: psycopg.Connection[Any], dialect: Dialect, values: dict[str, Any]
) -> list[Any]:
    """The rows (`CLAIMED_COLUMNS`) a claim with `values` takes, on psycopg's own
    connection (`Store._driver`, which commits on its own)."""
    return _ON_POSTGRES.driver_rows(driver, dialect, values)


def claim_on_sqlite(connection: Connection, values: dict[str, Any]) -> Sequence[Any]:
    """The rows (`CLAIMED_COLUMNS`) a claim with `values` takes, on `connection`."""
    return connection.execute(_ON_SQLITE, values).all()


def claim_within(connection: Connection, values: dict[str, Any]) -> Sequence[Any]:
    """The claim on a connection in a transaction already open (a claim of batch lines,
    inferq/store/batch_claims.py), of either dialect."""
    if on_postgres(connection):
        return _ON_POSTGRES.rows(connection, values)
    return claim_on_sqlite(connection, values)
