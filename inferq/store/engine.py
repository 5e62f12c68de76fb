"""Building the SQLAlchemy engine and session factory, once per process."""

from __future__ import annotations

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from inferq.store import text_codec


def make_engine(database_url: str, *, pool_size: int = 10) -> Engine:
    """An engine whose pooled connections are checked before use, so a database restart
    costs one failed attempt at most rather than a pool full of dead connections."""
    if database_url.startswith("sqlite"):
        engine = create_engine(
            database_url,
            connect_args={"check_same_thread": False},
            json_serializer=text_codec.dumps,
            json_deserializer=text_codec.loads,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        database_url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=True,
        pool_recycle=1800,
        json_serializer=text_codec.dumps,
        json_deserializer=text_codec.loads,
    )


def make_sessions(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def _sqlite_pragmas(dbapi_connection: object, _record: object) -> None:
    cursor = dbapi_connection.cursor()  # type: ignore[attr-defined]
    # WAL lets readers go on while the writer commits; the busy timeout turns lock
    # contention into a short wait instead of an error.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()
