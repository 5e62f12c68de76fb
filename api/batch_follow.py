"""Following a batch's output live: each line, in input order, once it and every line
before it have ended, as Server-Sent Events; a last event when the batch ends.

Each event's `id` is its line number, so a client that loses the connection resumes with
`Last-Event-ID` and gets every line after it, none twice; an event's data is the line as
the output file has it. An API process reads each followed batch once, however many
follow it (`BatchFeeds`): one reader per batch goes on from its cursor when lines of the
batch are announced ended, at most every `MIN_READ_INTERVAL_S`, and every `RECHECK_S`
without an announcement; it keeps the last `WINDOW_LINES` events, and a follower from
further back reads its own way up to them first."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from starlette.concurrency import run_in_threadpool

from inferq.domain.batches import Batch
from inferq.operations.batch_output import OutputPart
from inferq.wire.public import BatchPublic

# Most lines read at once: a reader of a large batch holds little memory.
LINES_PER_READ = 512
# Reads wait this long after the last one, so lines ending by the hundred a second cost a
# read a second, not one each, and a follower a write a second: every read takes cores
# from the engine.
MIN_READ_INTERVAL_S = 1.0
# Read again after this long without a word from the workers.
RECHECK_S = 1.0
# Rendered lines a batch's feed keeps for its followers.
WINDOW_LINES = 20_000

LINE_EVENT = b"line"
END_EVENT = b"end"


def sse(event: bytes, event_id: int, data: bytes) -> bytes:
    """One Server-Sent Event (`data` is one line: the output file's lines hold no newline)."""
    return b"event: %s\nid: %d\ndata: %s\n\n" % (event, event_id, data.rstrip(b"\n"))


@dataclass
class _Feed:
    """One batch's lines as events, read once for every follower in this process."""

    batch: Batch
    include_errors: bool
    start: int
    followers: int = 0
    cursor: int = 0
    lines: list[int] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)
    end: bytes | None = None
    failed: BaseException | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self.cursor = self.start

    @property
    def window_start(self) -> int:
        """Every line after this one that the feed has read, it still holds."""
        return self.lines[0] - 1 if self.lines else self.cursor

    def add(self, part: OutputPart) -> None:
        self.lines += [line for line, _ in part.lines]
        self.events += [sse(LINE_EVENT, line, data) for line, data in part.lines]
        self.cursor = part.cursor
        if len(self.lines) > WINDOW_LINES:
            del self.lines[:-WINDOW_LINES], self.events[:-WINDOW_LINES]
        self.changed.set()

    def since(self, after: int) -> tuple[bytes, int]:
        """The events of the lines after `after` it holds (all in one), and where they
        end."""
        first = bisect.bisect_right(self.lines, after)
        return b"".join(self.events[first:]), max(after, self.cursor)


class OutputParts(Protocol):
    """Where a batch's ended lines are read from (`BatchOutput`)."""

    def part(self, batch: Batch, *, after: int, include_errors: bool, limit: int) -> OutputPart: ...


class BatchReader(Protocol):
    """Where a batch is read again at its end (`BatchOperations`)."""

    def get(self, batch_id: str, *, scope: str | None) -> Batch: ...


class BatchWatcher(Protocol):
    """Who wakes a reader when lines of a batch end (`JobWaiter`)."""

    def watch_batch(
        self, batch_id: str
    ) -> contextlib.AbstractAsyncContextManager[asyncio.Event]: ...


class BatchFeeds:
    """The feeds of the batches this API process's clients follow."""

    def __init__(self, *, output: OutputParts, batches: BatchReader, waiter: BatchWatcher) -> None:
        self._output = output
        self._batches = batches
        self._waiter = waiter
        self._feeds: dict[tuple[str, bool], _Feed] = {}

    async def follow(
        self, batch: Batch, *, after: int, include_errors: bool
    ) -> AsyncIterator[bytes]:
        """`line` events (id: the line's number; data: the line as in the output file, or
        the error file with `include_errors`) from line `after + 1` on; then an `end`
        event with the batch once it has ended. Each chunk holds every event ready."""
        async with self._joined(batch, after=after, include_errors=include_errors) as feed:
            sent = after
            while True:
                if feed.failed is not None:
                    raise feed.failed
                if sent < feed.window_start:  # from before the window: its own way there
                    part = await self._read(batch, after=sent, include_errors=include_errors)
                    if part.lines:
                        yield b"".join(sse(LINE_EVENT, line, data) for line, data in part.lines)
                    if part.cursor == sent:  # the feed is behind this follower: wait for it
                        await self._changed(feed)
                    sent = part.cursor
                    continue
                feed.changed.clear()
                events, sent = feed.since(sent)
                if events:
                    yield events
                elif feed.end is not None:
                    yield feed.end
                    return
                else:
                    await self._changed(feed)

    @staticmethod
    async def _changed(feed: _Feed) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(feed.changed.wait(), RECHECK_S)

    @contextlib.asynccontextmanager
    async def _joined(
        self, batch: Batch, *, after: int, include_errors: bool
    ) -> AsyncIterator[_Feed]:
        key = (batch.id, include_errors)
        feed = self._feeds.get(key)
        if feed is None:
            feed = _Feed(batch=batch, include_errors=include_errors, start=after)
            feed.task = asyncio.create_task(self._read_on(feed))
            self._feeds[key] = feed
        feed.followers += 1
        try:
            yield feed
        finally:
            feed.followers -= 1
            if feed.followers == 0:
                del self._feeds[key]
                if feed.task is not None:
                    feed.task.cancel()

    async def _read(self, batch: Batch, *, after: int, include_errors: bool) -> OutputPart:
        read = functools.partial(
            self._output.part, batch, include_errors=include_errors, limit=LINES_PER_READ
        )
        return await run_in_threadpool(read, after=after)

    async def _read_on(self, feed: _Feed) -> None:
        """The feed's reader: reads on from its cursor as lines end, until the batch has."""
        try:
            async with self._waiter.watch_batch(feed.batch.id) as progressed:
                while True:
                    progressed.clear()
                    part = await self._read(
                        feed.batch, after=feed.cursor, include_errors=feed.include_errors
                    )
                    feed.add(part)
                    if part.more:
                        continue
                    if part.ended:
                        now = await run_in_threadpool(self._batches.get, feed.batch.id, scope=None)
                        if now.status.is_terminal:
                            data = BatchPublic.from_batch(now).model_dump_json().encode()
                            feed.end = sse(END_EVENT, feed.cursor, data)
                            feed.changed.set()
                            return
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(progressed.wait(), RECHECK_S)
                    await asyncio.sleep(MIN_READ_INTERVAL_S)
        except Exception as exc:  # noqa: BLE001  # whatever it was, its followers end with it
            feed.failed = exc
            feed.changed.set()
