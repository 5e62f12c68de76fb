"""What every store shares: its session factory and clock, transactions whose driver errors
are translated, statements compiled once to the driver's text, UTC datetimes,
tenant-scoped reads and pages of a listing."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, overload

import psycopg
from psycopg.rows import namedtuple_row
from sqlalchemy import ClauseElement, Connection, Dialect, Engine, Select, text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import InstrumentedAttribute, Session, sessionmaker
from sqlalchemy.pool import PoolProxiedConnection

from inferq.exceptions import NotFound, StoreUnavailable
from inferq.store.dialects import on_postgres

T = TypeVar("T")
RowT = TypeVar("RowT")


def utcnow() -> datetime:
    return datetime.now(UTC)


@overload
def as_utc(value: datetime) -> datetime: ...
@overload
def as_utc(value: None) -> None: ...
@overload
def as_utc(value: datetime | None) -> datetime | None: ...
def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything inferq stores is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


class Page(NamedTuple, Generic[T]):
    """One page of a listing, newest first."""

    items: list[T]
    has_more: bool


class Store:
    """The base of every store: built once per process and handed to whoever needs it."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        clock: Callable[[], datetime] = utcnow,
        keep_connections: bool = False,
    ) -> None:
        """`keep_connections`: each thread keeps the driver's connection it used last
        (`_driver`), for a process whose few threads make the same statements all day (a
        GPU worker)."""
        self._sessions = sessions
        self._engine: Engine = sessions.kw["bind"]
        self._autocommit = self._engine.execution_options(isolation_level="AUTOCOMMIT")
        self._clock = clock
        self._held = _KeptConnections() if keep_connections else None
        # Which database this is, asked once (else SQLite): inferq/store/dialects.py.
        self._postgres = on_postgres(self._engine)

    @contextmanager
    def _transaction(self) -> Iterator[Session]:
        """A session in a transaction, committed at the end (rolled back on an error)."""
        with _translated(), self._sessions.begin() as session:
            yield session

    @contextmanager
    def _statement(self) -> Iterator[Connection]:
        """A connection for one statement, which commits on its own, for the hottest
        statements: an ORM session's bookkeeping costs more CPU than a small query (a
        quarter of a job read), and a transaction around one statement costs two round
        trips more (BEGIN, COMMIT)."""
        with _translated(), self._autocommit.connect() as connection:
            yield connection

    @contextmanager
    def _driver(self) -> Iterator[psycopg.Connection[Any]]:
        """psycopg's own connection in autocommit, for one statement that commits on its
        own: the worker's hottest statements (its claims and flushes), which cost less CPU
        on the driver than through SQLAlchemy's connection. On PostgreSQL only. A store that
        holds connections keeps it for the thread's next statement (sparing the pool's
        checkout and return); otherwise it goes back to the pool.

        An error of a lost connection is `StoreUnavailable`, and renews the pool (as
        SQLAlchemy does when it sees one), so that one failed attempt, not one per
        connection, follows a database restart: a held connection is let go then too."""
        held = self._held
        holder = held.holder if held is not None else None
        if holder is None:
            holder = _Holder(self._checkout(), generic_plans=held is not None)
        driver = holder.driver
        try:
            holder.ready()
            yield driver
        except psycopg.Error as exc:
            lost = driver.broken or driver.closed
            if lost:
                holder.invalidate(exc)
                self._engine.dispose()
            if lost or isinstance(exc, psycopg.OperationalError):
                raise StoreUnavailable(f"the database is unavailable: {exc}") from exc
            raise
        finally:
            idle = driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            if held is not None and idle and not (driver.broken or driver.closed):
                held.holder = holder
            else:
                if held is not None:
                    held.holder = None
                holder.let_go()

    def let_go(self) -> None:
        """The calling thread's held connection goes back to the pool (before the pool is
        disposed of: one returned after is left open)."""
        if self._held is not None and (holder := self._held.holder) is not None:
            self._held.holder = None
            holder.let_go()

    def _checkout(self) -> PoolProxiedConnection:
        try:
            with _translated():
                return self._engine.raw_connection()
        except psycopg.OperationalError as exc:  # the pool hands the driver's error on
            raise StoreUnavailable(f"the database is unavailable: {exc}") from exc

    @contextmanager
    def _reading(self) -> Iterator[Session]:
        """A session outside an explicit transaction, for a long read through a
        server-side cursor. It locks no rows, and may wait on a slow client between its
        fetches for as long as the client takes: Postgres does not end it as idle (see
        `inferq.store.database`)."""
        with _translated(), self._sessions() as session:
            if self._postgres:
                session.execute(text("SET LOCAL idle_in_transaction_session_timeout = 0"))
            yield session


class _Holder:
    """A pooled connection whose driver is in autocommit until it goes back to the pool:
    when the store lets go of it, or with the thread that held it.

    With `generic_plans`, a held connection's statements (a worker's claims and flushes,
    each looked up by primary key) are planned once, not at each execution. psycopg
    prepares a statement it has run five times; Postgres then plans it again at every
    execution whenever a plan for its values costs less than one for any values, which
    for a claim or a flush of a few ids is always: planning a flush cost Postgres about
    as much as running it. The setting is the connection's, so it is undone before the
    connection goes back to the pool."""

    __slots__ = ("_planning_set", "driver", "generic_plans", "pooled")

    def __init__(self, pooled: PoolProxiedConnection, *, generic_plans: bool) -> None:
        driver = pooled.driver_connection
        assert isinstance(driver, psycopg.Connection)
        driver.autocommit = True
        self.pooled: PoolProxiedConnection | None = pooled
        self.driver: psycopg.Connection[Any] = driver
        # Asked for, and not yet set on the connection (`ready` sets it).
        self.generic_plans = generic_plans
        self._planning_set = False

    def ready(self) -> None:
        """Set the connection up before its first statement (may raise psycopg's error)."""
        if self.generic_plans and not self._planning_set:
            self.driver.execute(_GENERIC_PLANS)
            self._planning_set = True

    def let_go(self) -> None:
        pooled, self.pooled = self.pooled, None
        if pooled is None or not pooled.is_valid:  # let go already, or invalidated
            return
        if not (self.driver.broken or self.driver.closed):
            if self._planning_set and not self._planning_undone():
                pooled.invalidate()  # not fit to go back as it is
                return
            self.driver.autocommit = False  # as the pool hands it to others
        pooled.close()

    def _planning_undone(self) -> bool:
        """Plan as other connections do again; False where that cannot be done: inside a
        transaction (the pool's rollback would undo it), or on a connection that fails."""
        if self.driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            return False
        try:
            self.driver.execute(_PLANS_AS_BEFORE)
        except psycopg.Error:
            return False
        return True

    def invalidate(self, exc: BaseException) -> None:
        pooled, self.pooled = self.pooled, None
        if pooled is not None:
            pooled.invalidate(exc)

    def __del__(self) -> None:
        # The thread that held it has ended: back to the pool, where the garbage
        # collector would otherwise find it checked out (and say so).
        with contextlib.suppress(Exception):
            self.let_go()


_GENERIC_PLANS = "SET plan_cache_mode = force_generic_plan"
_PLANS_AS_BEFORE = "RESET plan_cache_mode"


class _KeptConnections(threading.local):
    holder: _Holder | None = None


class DriverStatement:
    """A PostgreSQL statement compiled once to psycopg's text, with the values it holds
    itself: run as text (`Connection.exec_driver_sql`), it skips SQLAlchemy's rendering
    of its parameters at every execution, and a lost connection is still seen as one."""

    def __init__(self, statement: ClauseElement) -> None:
        self._statement = statement
        self._compiled: tuple[str, dict[str, Any]] | None = None

    def rows(self, connection: Connection, values: dict[str, Any]) -> Sequence[Any]:
        """Run it on `connection` with `values` for its parameters; the rows it returns."""
        compiled_text, constants = self._compile(connection.dialect)
        return connection.exec_driver_sql(compiled_text, {**constants, **values}).all()

    def driver_rows(
        self, driver: psycopg.Connection[Any], dialect: Dialect, values: dict[str, Any]
    ) -> list[Any]:
        """`rows`, on the driver's own connection (`Store._driver`): named tuples."""
        compiled_text, constants = self._compile(dialect)
        with driver.cursor(row_factory=namedtuple_row) as cursor:
            return cursor.execute(compiled_text, {**constants, **values}).fetchall()

    def _compile(self, dialect: Dialect) -> tuple[str, dict[str, Any]]:
        if self._compiled is None:  # compiled by the first caller: the same text for all
            compiled = self._statement.compile(dialect=dialect)
            constants = {k: v for k, v in compiled.params.items() if v is not None}
            self._compiled = str(compiled), constants
        return self._compiled


@contextmanager
def _translated() -> Iterator[None]:
    """Turn a lost or refused database connection into `StoreUnavailable`."""
    try:
        yield
    except OperationalError as exc:
        raise StoreUnavailable(f"the database is unavailable: {exc.orig}") from exc
    except DBAPIError as exc:
        if exc.connection_invalidated:
            raise StoreUnavailable(f"the database connection was lost: {exc.orig}") from exc
        raise


class _Owned(Protocol):
    @property
    def tenant(self) -> str: ...


OwnedT = TypeVar("OwnedT", bound=_Owned)


def scoped_row(
    session: Session,
    model: type[OwnedT],
    row_id: str,
    scope: str | None,
    *,
    noun: str,
    for_update: bool = False,
) -> OwnedT:
    """The row with this id, if it belongs to `scope` (a tenant; None sees every tenant)."""
    row = session.get(model, row_id, with_for_update=for_update)
    # Another tenant's row is "not found", so ids cannot be probed across tenants.
    if row is None or (scope is not None and row.tenant != scope):
        raise NotFound(f"no {noun} with id {row_id!r}")
    return row


def newest_first(
    session: Session,
    query: Select[RowT],
    key: InstrumentedAttribute[str],
    *,
    after: str | None,
    limit: int,
    convert: Callable[[Sequence[RowT]], list[T]],
) -> Page[T]:
    """A page of `query`'s rows, newest first by `key` (an id that sorts by age), that
    follows the row with id `after`; `convert` makes the page's rows domain objects."""
    query = query.order_by(key.desc()).limit(limit + 1)
    if after is not None:
        query = query.where(key < after)
    rows = session.scalars(query).all()
    return Page(convert(rows[:limit]), has_more=len(rows) > limit)
