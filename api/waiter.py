"""Long-poll support: wakes requests waiting on a job when the worker reports it done."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterator

from redis.asyncio import Redis
from redis.exceptions import RedisError

from inferq.events import decode_ids, done_channel

log = logging.getLogger(__name__)


class JobWaiter:
    """One pub/sub subscription per API process, fanned out to every waiting request."""

    def __init__(self, redis: Redis, *, key_prefix: str) -> None:
        self._redis = redis
        self._channel = done_channel(key_prefix)
        self._watchers: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen(), name="job-waiter")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.contextmanager
    def watch(self, job_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever `job_id` is reported finished while the block runs."""
        event = asyncio.Event()
        self._watchers[job_id].add(event)
        try:
            yield event
        finally:
            watchers = self._watchers.get(job_id)
            if watchers is not None:
                watchers.discard(event)
                if not watchers:
                    del self._watchers[job_id]

    def _notify(self, job_ids: list[str]) -> None:
        for job_id in job_ids:
            for event in self._watchers.get(job_id, ()):
                event.set()

    async def _listen(self) -> None:
        while True:
            try:
                async with self._redis.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self._channel)
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._notify(decode_ids(message["data"]))
            except RedisError as exc:
                # Waiters re-read Postgres every second anyway; this only costs latency.
                log.warning("job waiter lost Redis (%s); resubscribing", exc)
                await asyncio.sleep(1)
