"""The depths of each served model's GPU queues, read straight from Redis (kombu keeps each
queue as a list)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from redis import Redis
from redis.exceptions import RedisError

from inferq.domain.queue_names import gpu_queues
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

    def depths(self, models: Iterable[str]) -> dict[str, int]:
        """The depth of each GPU queue of these served models."""
        return {queue: self.depth(queue) for model in models for queue in gpu_queues(model)}
