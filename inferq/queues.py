"""Reading queue depths straight from Redis (kombu keeps each queue as a list)."""

from __future__ import annotations

from typing import cast

from redis import Redis
from redis.exceptions import RedisError

from inferq.constants import GPU_QUEUES
from inferq.exceptions import BrokerUnavailable


class QueueMonitor:
    """How many messages wait in each queue, not yet taken by a worker."""

    def __init__(self, redis: Redis, *, key_prefix: str) -> None:
        self._redis = redis
        self._key_prefix = key_prefix

    def depth(self, queue: str) -> int:
        try:
            # redis-py types its sync client as sync-or-async; this one is sync.
            return cast(int, self._redis.llen(self._key_prefix + queue))
        except RedisError as exc:
            raise BrokerUnavailable(f"could not read queue {queue!r} from Redis: {exc}") from exc

    def depths(self) -> dict[str, int]:
        return {queue: self.depth(queue) for queue in GPU_QUEUES}
