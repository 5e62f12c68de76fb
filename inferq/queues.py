"""The GPU queues of each served model, and their depths read straight from Redis (kombu
keeps each queue as a list)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from redis import Redis
from redis.exceptions import RedisError

from inferq.constants import BULK_QUEUE, INTERACTIVE_QUEUE
from inferq.exceptions import BrokerUnavailable

# A served model's queues are named `<kind>:<served model name>`, so a worker consumes
# only its own model's work (an adapter's jobs go to its base model's queues).
_SEPARATOR = ":"


def interactive_queue(model: str) -> str:
    """The queue of single jobs for the served model `model`."""
    return f"{INTERACTIVE_QUEUE}{_SEPARATOR}{model}"


def bulk_queue(model: str) -> str:
    """The queue of batch lines for the served model `model`."""
    return f"{BULK_QUEUE}{_SEPARATOR}{model}"


def gpu_queues(model: str) -> tuple[str, str]:
    """What a worker serving `model` consumes, the one it takes from first first."""
    return interactive_queue(model), bulk_queue(model)


def is_bulk(queue: str) -> bool:
    return queue.partition(_SEPARATOR)[0] == BULK_QUEUE


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
