"""The database connection pool (SQLAlchemy calls it an `Engine`) and session factory,
built once per process."""

from __future__ import annotations

from functools import partial

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from inferq.store import text_codec

# inferq's transactions are a few statements sent together, never a conversation: a
# session idle inside one for this long belongs to a process that has stopped (SIGSTOP, a
# debugger, a VM paused). Postgres ends it, so the rows it locked (a batch's lines, a job
# being cancelled) are not held from every other process until it wakes; it then finds
# its connection gone and writes again, as after a database restart.
IDLE_IN_TRANSACTION_S = 15


def make_database(
    database_url: str,
    *,
    pool_size: int = 10,
    idle_in_transaction_s: int = IDLE_IN_TRANSACTION_S,
    pre_ping: bool = True,
) -> Engine:
    """A connection pool whose connections are checked before use (`pre_ping`), so a
    database restart costs no failed attempt.

    Without the check, the first use of a connection the restart broke fails
    (`StoreUnavailable`) and the whole pool is renewed: one failed attempt a process. That
    suits a process that retries every store call, the GPU worker, where the check was a
    round trip in each of a job's two transactions (its claim and its result)."""
    if database_url.startswith("sqlite"):
        engine = create_engine(
            database_url,
            connect_args={"check_same_thread": False},
            json_serializer=text_codec.dumps,
            json_deserializer=text_codec.loads,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        pool_recycle=1800,
        json_serializer=text_codec.dumps,
        json_deserializer=text_codec.loads,
    )
    event.listen(engine, "connect", partial(_postgres_settings, idle_s=idle_in_transaction_s))
    return engine


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _postgres_settings(dbapi_connection: object, _record: object, *, idle_s: int) -> None:
    # A SET, not a startup option, so that it passes through pgbouncer; committed, or the
    # pool's first rollback would undo it.
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    cursor.execute(f"SET idle_in_transaction_session_timeout = '{int(idle_s)}s'")
    cursor.close()
    dbapi_connection.commit()  # type: ignore[attr-defined]


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    # WAL lets readers go on while the writer commits; the busy timeout turns lock
    # contention into a short wait instead of an error.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
