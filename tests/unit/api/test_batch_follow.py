"""Followers of a batch's output in one API process share one reader of it
(api/batch_follow.py): each gets every line once, in order, then the end, whether it came
first, joined later, or came back from further than the lines the feed still holds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest

from api import batch_follow
from api.batch_follow import BatchFeeds
from inferq.domain.batches import Batch, BatchStatus
from inferq.operations.batch_output import OutputPart

BATCH = Batch(
    id="batch_1",
    tenant="t",
    endpoint="/v1/chat/completions",
    input_file_id="file-1",
    completion_window="24h",
    status=BatchStatus.IN_PROGRESS,
    created_at=datetime(2026, 1, 1, tzinfo=UTC),
    expires_at=datetime(2026, 1, 2, tzinfo=UTC),
)


class Lines:
    """A batch whose first `ended` lines have ended, read as BatchOutput.part reads (the
    batch, its id and a caller's scope are the fake's to ignore)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.ended = 0
        self.reads = 0
        self.progressed: list[asyncio.Event] = []

    def part(self, batch: Batch, *, after: int, include_errors: bool, limit: int) -> OutputPart:
        self.reads += 1
        before = min(self.ended, after + limit) + 1
        lines = [(n, b'{"line": %d}\n' % n) for n in range(after + 1, before)]
        return OutputPart(
            cursor=max(after, before - 1),
            ended=self.ended == self.total and before - 1 == self.total,
            more=before - 1 < self.ended,
            lines=lines,
        )

    def get(self, batch_id: str, *, scope: str | None) -> Batch:
        status = BatchStatus.COMPLETED if self.ended == self.total else BatchStatus.IN_PROGRESS
        return dataclasses.replace(BATCH, status=status)

    @contextlib.asynccontextmanager
    async def watch_batch(self, batch_id: str) -> AsyncIterator[asyncio.Event]:
        event = asyncio.Event()
        self.progressed.append(event)
        try:
            yield event
        finally:
            self.progressed.remove(event)

    def end(self, count: int) -> None:
        """`count` more lines end, and the workers say so."""
        self.ended = min(self.total, self.ended + count)
        for event in self.progressed:
            event.set()


def feeds_of(lines: Lines) -> BatchFeeds:
    return BatchFeeds(output=lines, batches=lines, waiter=lines)


async def collect(feeds: BatchFeeds, *, after: int) -> list[tuple[str, int]]:
    """The (event, id) of everything a follower gets."""
    got = []
    async for chunk in feeds.follow(BATCH, after=after, include_errors=True):
        for event in chunk.decode().strip().split("\n\n"):
            fields = dict(line.split(": ", 1) for line in event.split("\n"))
            got.append((fields["event"], int(fields["id"])))
    return got


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_follow, "MIN_READ_INTERVAL_S", 0.0)
    monkeypatch.setattr(batch_follow, "LINES_PER_READ", 7)


def test_followers_get_every_line_once_in_order_and_share_the_reads() -> None:
    async def run() -> tuple[list[list[tuple[str, int]]], int]:
        lines = Lines(100)
        feeds = feeds_of(lines)
        early = asyncio.create_task(collect(feeds, after=0))
        await asyncio.sleep(0)
        lines.end(30)
        await asyncio.sleep(0.05)
        late = asyncio.create_task(collect(feeds, after=10))  # joins from line 11
        for _ in range(7):
            lines.end(10)
            await asyncio.sleep(0.01)
        return list(await asyncio.gather(early, late)), lines.reads

    (early, late), reads = asyncio.run(run())
    assert early == [("line", n) for n in range(1, 101)] + [("end", 100)]
    assert late == [("line", n) for n in range(11, 101)] + [("end", 100)]
    # One reader for both: about what one follower alone reads, not twice that.
    assert reads <= 100 // 7 + 10


def test_a_follower_from_before_the_window_reads_its_own_way_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(batch_follow, "WINDOW_LINES", 20)

    async def run() -> list[tuple[str, int]]:
        lines = Lines(80)
        feeds = feeds_of(lines)
        ahead = asyncio.create_task(collect(feeds, after=0))
        await asyncio.sleep(0)
        lines.end(60)  # the feed holds lines 41 to 60 now
        await asyncio.sleep(0.05)
        behind = asyncio.create_task(collect(feeds, after=5))
        await asyncio.sleep(0.05)
        lines.end(20)
        await ahead
        return await behind

    assert asyncio.run(run()) == [("line", n) for n in range(6, 81)] + [("end", 80)]


def test_a_batch_that_has_ended_sends_only_its_end_from_its_last_line() -> None:
    async def run() -> list[tuple[str, int]]:
        lines = Lines(10)
        lines.end(10)
        return await collect(feeds_of(lines), after=10)

    assert asyncio.run(run()) == [("end", 10)]
