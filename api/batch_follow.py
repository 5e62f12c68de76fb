"""Following a batch's output live: each line, in input order, once it and every line
before it have ended, as Server-Sent Events; a last event when the batch ends.

Server-Sent Events rather than JSON lines: each event carries its line number as its `id`,
so a client that loses the connection asks again with `Last-Event-ID` (EventSource does it
by itself) and gets every line after it, none twice; the data of each event is the line
exactly as the output file has it. Reads go on from the cursor (lines walked from it by
index, never the whole batch) when the workers announce that lines of the batch ended
(`JobWaiter.watch_batch`), at most `MIN_READ_INTERVAL_S` apart, and every `RECHECK_S`
without an announcement (cancelled and expired lines are not announced).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator

from sse_starlette import ServerSentEvent
from starlette.concurrency import run_in_threadpool

from api.waiter import JobWaiter
from inferq.domain.batches import Batch
from inferq.operations.batch_output import BatchOutput
from inferq.operations.batches import BatchOperations
from inferq.wire.public import BatchPublic

# Most lines read and sent at once: a follower of a large batch holds little memory.
LINES_PER_READ = 512
# Reads wait this long after the last one, so lines ending by the hundred a second cost a
# few reads a second, not one each.
MIN_READ_INTERVAL_S = 0.2
# Read again after this long without a word from the workers.
RECHECK_S = 1.0

LINE_EVENT = "line"
END_EVENT = "end"


async def followed_output(
    batch: Batch,
    *,
    after: int,
    include_errors: bool,
    scope: str | None,
    batches: BatchOperations,
    output: BatchOutput,
    waiter: JobWaiter,
) -> AsyncIterator[ServerSentEvent]:
    """`line` events (id: the line's number; data: the line as in the output file, or the
    error file with `include_errors`) from line `after + 1` on; then an `end` event with
    the batch once it has ended."""
    read = functools.partial(
        output.part, batch, include_errors=include_errors, limit=LINES_PER_READ
    )
    cursor = after
    async with waiter.watch_batch(batch.id) as progressed:
        while True:
            progressed.clear()
            part = await run_in_threadpool(read, after=cursor)
            for line, data in part.lines:
                yield ServerSentEvent(
                    data=data.decode().rstrip("\n"), id=str(line), event=LINE_EVENT
                )
            cursor = part.cursor
            if part.more:
                continue
            if part.ended:
                now = await run_in_threadpool(batches.get, batch.id, scope=scope)
                if now.status.is_terminal:
                    public = BatchPublic.from_batch(now).model_dump_json()
                    yield ServerSentEvent(data=public, id=str(cursor), event=END_EVENT)
                    return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(progressed.wait(), RECHECK_S)
            await asyncio.sleep(MIN_READ_INTERVAL_S)
