"""A clock the tests move by hand."""

from __future__ import annotations

from datetime import UTC, datetime


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now
