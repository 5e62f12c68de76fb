"""What every store shares: the clock, UTC datetimes, and driver errors translated."""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import UTC, datetime
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

from inferq.exceptions import StoreUnavailable

P = ParamSpec("P")
T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


def translate_errors(method: Callable[P, T]) -> Callable[P, T]:
    """Turn a lost or refused database connection into `StoreUnavailable`."""

    @functools.wraps(method)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return method(*args, **kwargs)
        except OperationalError as exc:
            raise StoreUnavailable(f"the database is unavailable: {exc.orig}") from exc
        except DBAPIError as exc:
            if exc.connection_invalidated:
                raise StoreUnavailable(f"the database connection was lost: {exc.orig}") from exc
            raise

    return wrapper


def as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; everything inferq stores is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value
