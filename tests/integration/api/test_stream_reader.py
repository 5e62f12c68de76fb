"""One reader for every followed token stream, through real Redis: each follower gets
its own stream's entries, a stream followed while the reader blocks is read at once, and
followers are told when Redis cannot be read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from redis.asyncio import Redis

from api.stream_reader import Entries, StreamReader
from tests.conftest import REDIS_URL
from tests.helpers.processes import free_port

SAFETY_S = 10  # far beyond any wait here: a hang fails the test instead


def reading(
    scenario: Callable[[StreamReader, Redis], Awaitable[object]],
    *,
    block_ms: int,
    url: str = REDIS_URL,
) -> object:
    async def run() -> object:
        redis = Redis.from_url(url)
        reader = StreamReader(redis, block_ms=block_ms)
        await reader.start()
        try:
            return await scenario(reader, redis)
        finally:
            await reader.stop()
            await redis.aclose()

    return asyncio.run(run())


def texts(entries: Entries | None) -> list[bytes]:
    assert entries is not None
    return [fields[b"t"] for _, fields in entries]


def test_each_follower_gets_its_own_stream_from_its_first_entry(key_prefix: str) -> None:
    a, b = f"{key_prefix}a", f"{key_prefix}b"

    async def scenario(reader: StreamReader, redis: Redis) -> tuple[list[bytes], list[bytes]]:
        await redis.xadd(a, {"t": "a1"})
        async with reader.follow(a) as from_a, reader.follow(b) as from_b:
            await redis.xadd(b, {"t": "b1"})
            await redis.xadd(a, {"t": "a2"})
            got_a: list[bytes] = []
            while len(got_a) < 2:
                got_a += texts(await asyncio.wait_for(from_a.get(), SAFETY_S))
            got_b = texts(await asyncio.wait_for(from_b.get(), SAFETY_S))
            return got_a, got_b

    assert reading(scenario, block_ms=1000) == ([b"a1", b"a2"], [b"b1"])


def test_a_stream_followed_while_the_reader_blocks_is_read_at_once(key_prefix: str) -> None:
    quiet, busy = f"{key_prefix}quiet", f"{key_prefix}busy"

    async def scenario(reader: StreamReader, redis: Redis) -> list[bytes]:
        await redis.xadd(busy, {"t": "first"})
        async with reader.follow(quiet):
            await asyncio.sleep(0.2)  # the reader is now blocked on the quiet stream alone
            async with reader.follow(busy) as from_busy:
                # With a block of a minute, only an ended read brings this in time.
                return texts(await asyncio.wait_for(from_busy.get(), SAFETY_S))

    assert reading(scenario, block_ms=60_000) == [b"first"]


def test_followers_are_told_when_redis_cannot_be_read(key_prefix: str) -> None:
    async def scenario(reader: StreamReader, redis: Redis) -> Entries | None:
        async with reader.follow(f"{key_prefix}s") as arriving:
            return await asyncio.wait_for(arriving.get(), SAFETY_S)

    nobody = f"redis://127.0.0.1:{free_port()}/0"
    assert reading(scenario, block_ms=1000, url=nobody) is None
