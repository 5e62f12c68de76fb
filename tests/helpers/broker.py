"""What a deployment's Redis shows: the GPU work its messages still carry (waiting, or
taken by a worker that has not acknowledged them yet, as the worker says), and the
maintenance passes that ran."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis import Redis

from inferq.broker.celery_app import make_celery
from inferq.constants import (
    BULK_QUEUE,
    INTERACTIVE_QUEUE,
    MAINTENANCE_LAST_RUN_KEY,
    RUN_JOBS_TASK,
)
from tests.helpers.waiting import wait_until

# How long the workers have to say which messages they hold.
INSPECT_S = 1.0


@dataclass(frozen=True)
class _BrokerSettings:
    redis_url: str
    redis_key_prefix: str


class Broker:
    def __init__(self, redis_url: str, *, key_prefix: str) -> None:
        self._redis = Redis.from_url(redis_url)
        self._prefix = key_prefix
        self._celery = make_celery(_BrokerSettings(redis_url, key_prefix))

    @classmethod
    def of(cls, env: Mapping[str, str]) -> Broker:
        """The Redis and key space of the deployment that runs with `env`."""
        return cls(env["INFERQ_REDIS_URL"], key_prefix=env["INFERQ_REDIS_KEY_PREFIX"])

    def close(self) -> None:
        self._redis.close()
        self._celery.close()

    def gpu_jobs(self) -> set[str]:
        """Job ids in the GPU messages still waiting in Redis or taken and not yet
        acknowledged. A worker acknowledges a message once each of its jobs has ended
        there (written, skipped or aborted), so a job absent here is done with."""
        found: set[str] = set()
        for kind in (INTERACTIVE_QUEUE, BULK_QUEUE):  # every served model's queues
            for key in self._redis.scan_iter(match=f"{self._prefix}{kind}:*"):
                for message in self._redis.lrange(key, 0, -1):
                    found.update(_job_ids(json.loads(message)))
        # Asked after the lists: a message taken meanwhile is held by then.
        return found | self.held_jobs()

    def held_jobs(self) -> set[str]:
        """Job ids in the GPU messages workers have taken and not acknowledged, as each
        worker says (Celery's remote control): kombu keeps them in the worker's memory."""
        inspect = self._celery.control.inspect(timeout=INSPECT_S)
        found: set[str] = set()
        for replies in (inspect.reserved(), inspect.active()):
            for requests in (replies or {}).values():
                for request in requests:
                    if request.get("name") == RUN_JOBS_TASK:
                        found.update(str(job_id) for job_id in request["args"][0])
        return found

    def wait_gpu_messages_done(self, job_ids: set[str] | None = None, *, timeout_s: float) -> None:
        """Wait until no GPU message carries any of `job_ids` (any job at all if None)."""

        def pending() -> set[str]:
            jobs = self.gpu_jobs()
            return jobs if job_ids is None else jobs & job_ids

        wait_until(
            lambda: not pending(),
            timeout_s=timeout_s,
            what="every GPU message acknowledged",
            interval_s=0.1,
        )

    def last_maintenance(self) -> bytes | None:
        """When the last maintenance pass ended (its own clock), as it wrote it."""
        raw = self._redis.get(self._prefix + MAINTENANCE_LAST_RUN_KEY)
        return raw if isinstance(raw, bytes) else None

    def wait_maintenance_passes(self, count: int, *, timeout_s: float) -> None:
        """Wait until `count` more maintenance passes have ended. The first may have begun
        before the call; each after it began after the call."""
        seen = [self.last_maintenance()]

        def passed() -> bool:
            if (last := self.last_maintenance()) != seen[-1]:
                seen.append(last)
            return len(seen) > count

        wait_until(passed, timeout_s=timeout_s, what=f"{count} maintenance passes", interval_s=0.1)


def _job_ids(envelope: dict[str, Any]) -> list[str]:
    """The job ids a `run_jobs` message carries: kombu's JSON envelope around a base64
    body that holds Celery's [args, kwargs, embed], the ids being the one argument."""
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    args = json.loads(body)[0]
    return [str(job_id) for job_id in args[0]]
