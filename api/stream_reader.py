"""One blocking XREAD for every token stream this API process follows.

A stream followed with XREADs of its own costs a round trip to Redis per engine step per
stream: at 64 streams, the largest part of the API's CPU for streamed requests. Here one
task reads every followed stream in one XREAD, on a connection of its own, and hands each
stream's entries to its follower through a queue: one round trip per step for all of
them. A stream followed while that XREAD blocks is read at once: the blocked command is
ended with `CLIENT UNBLOCK` and sent again with the new stream in it.

If Redis cannot be read, every follower is told (`None` on its queue) and goes on through
Postgres, as a follower whose own read failed did.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError

from inferq.host import supervision

log = logging.getLogger(__name__)

Entries = list[tuple[bytes, dict[bytes, bytes]]]

# Most entries of one stream taken in one read.
READ_ENTRIES = 512
RECONNECT_S = 1.0
# How long a new follower waits between tries to end a read that has not reached Redis
# yet (it is on its way, and ends with the next entry of any stream or its block).
UNBLOCK_RETRY_S = 0.002


@dataclass
class _Followed:
    last: bytes | str = "0-0"
    queue: asyncio.Queue[Entries | None] = field(default_factory=asyncio.Queue)


class StreamReader:
    """Reads the Redis Streams this process's followers follow, all in one XREAD."""

    def __init__(self, redis: Redis, *, block_ms: int) -> None:
        self._redis = redis
        self._block_ms = block_ms
        self._followed: dict[str, _Followed] = {}
        self._reading: frozenset[str] | None = None  # the streams of the read under way
        self._client_id: int | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = supervision.watch_task(asyncio.create_task(self._run(), name="stream-reader"))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.asynccontextmanager
    async def follow(self, key: str) -> AsyncIterator[asyncio.Queue[Entries | None]]:
        """A queue of the stream's entries from its first on, while the block runs;
        `None` on it if Redis could not be read."""
        followed = _Followed()
        self._followed[key] = followed
        try:
            await self._include(key)
            yield followed.queue
        finally:
            if self._followed.get(key) is followed:
                del self._followed[key]

    async def _include(self, key: str) -> None:
        """Make the reader read `key` from now on: end a blocked read that leaves it out."""
        self._wake.set()
        while (reading := self._reading) is not None and key not in reading:
            client_id = self._client_id
            if client_id is None:
                return
            try:
                if await self._redis.client_unblock(client_id):
                    return
            except RedisError:
                return  # the reader is failing too, and will tell the follower
            await asyncio.sleep(UNBLOCK_RETRY_S)

    async def _run(self) -> None:
        while True:
            client = self._redis.client()
            try:
                self._client_id = await client.client_id()
                while True:
                    await self._read(client)
            except Exception as exc:  # the reader must live on
                if isinstance(exc, RedisError):
                    log.warning("cannot read token streams (%s); retrying", exc)
                else:
                    log.exception("reading token streams failed; retrying")
                for followed in self._followed.values():
                    followed.queue.put_nowait(None)
                self._followed.clear()
            finally:
                self._client_id = None
                self._reading = None
                with contextlib.suppress(RedisError):
                    await client.aclose()
            await asyncio.sleep(RECONNECT_S)

    async def _read(self, client: Redis) -> None:
        self._wake.clear()
        if not self._followed:
            await self._wake.wait()
            return
        streams: dict[bytes | str | memoryview, int | bytes | str | memoryview] = {
            key: followed.last for key, followed in self._followed.items()
        }
        self._reading = frozenset(self._followed)
        try:
            reply = await client.xread(streams, count=READ_ENTRIES, block=self._block_ms)
        finally:
            self._reading = None
        pairs = reply.items() if isinstance(reply, dict) else reply or ()  # RESP3, RESP2
        for raw_key, entries in pairs:
            key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
            followed = self._followed.get(key)
            if followed is not None and entries:
                followed.last = entries[-1][0]
                followed.queue.put_nowait(entries)
