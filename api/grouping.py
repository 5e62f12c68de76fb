"""Group commit: concurrent requests share one trip to a worker thread (one transaction,
one publish) instead of taking one each.

The first request of a quiet spell goes at once, alone; requests that arrive while a
group is being handled form the next group. Nothing waits on a timer, so an idle system
answers as fast as before and a busy one does one piece of work for many requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from starlette.concurrency import run_in_threadpool

T = TypeVar("T")
R = TypeVar("R")


class Grouped(Generic[T, R]):
    """`await grouped(item)` runs `handle` on a group of items in a worker thread.

    `handle` returns one entry per item, in order: its result, or the exception that item
    alone must raise. An exception `handle` raises itself is raised by every item of
    the group.
    """

    def __init__(
        self, handle: Callable[[Sequence[T]], Sequence[R | BaseException]], *, max_items: int
    ) -> None:
        self._handle = handle
        self._max_items = max_items
        self._pending: list[tuple[T, asyncio.Future[R]]] = []
        self._drainer: asyncio.Task[None] | None = None

    async def __call__(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        try:
            while self._pending:
                group = self._pending[: self._max_items]
                del self._pending[: self._max_items]
                await self._run(group)
        finally:
            self._drainer = None

    async def _run(self, group: list[tuple[T, asyncio.Future[R]]]) -> None:
        outcomes: Sequence[R | BaseException]
        try:
            outcomes = await run_in_threadpool(self._handle, [item for item, _ in group])
        except asyncio.CancelledError:
            for _, future in group:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - handed to every request of the group
            outcomes = [exc] * len(group)
        for (_, future), outcome in zip(group, outcomes, strict=True):
            if future.done():  # the request went away (client hung up)
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
