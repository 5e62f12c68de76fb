"""Job events over Redis pub/sub: "finished" wakes long-polls, "cancelled" reaches workers.

Pub/sub is a hint that saves latency, never the truth: whoever listens also re-reads
Postgres on a timer, so a lost message costs a second, not a job.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Protocol

from redis import Redis
from redis.exceptions import RedisError

from inferq.constants import JOBS_CANCEL_CHANNEL, JOBS_DONE_CHANNEL

log = logging.getLogger(__name__)


def done_channel(key_prefix: str) -> str:
    return key_prefix + JOBS_DONE_CHANNEL


def cancel_channel(key_prefix: str) -> str:
    return key_prefix + JOBS_CANCEL_CHANNEL


def decode_ids(data: bytes | str) -> list[str]:
    ids = json.loads(data)
    return [str(i) for i in ids] if isinstance(ids, list) else []


class FinishedJobs(Protocol):
    """Who hears that jobs' results are committed: Redis pub/sub, or nobody (`inferq run`)."""

    def finished(self, job_ids: Sequence[str]) -> None: ...


class JobEvents:
    """Publishes job events; failures are logged, never raised (see the module doc)."""

    def __init__(self, redis: Redis, *, key_prefix: str) -> None:
        self._redis = redis
        self._done = done_channel(key_prefix)
        self._cancel = cancel_channel(key_prefix)

    def finished(self, job_ids: Sequence[str]) -> None:
        self._publish(self._done, job_ids)

    def cancelled(self, job_ids: Sequence[str]) -> None:
        self._publish(self._cancel, job_ids)
        self._publish(self._done, job_ids)

    def _publish(self, channel: str, job_ids: Sequence[str]) -> None:
        if not job_ids:
            return
        try:
            self._redis.publish(channel, json.dumps(list(job_ids)))
        except RedisError as exc:
            log.warning("could not publish %d job events to %s: %s", len(job_ids), channel, exc)
