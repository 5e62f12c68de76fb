"""Heartbeats written into Redis as a GPU worker writes them: a worker online, as the
API, `inferq doctor` and maintenance see it, without running one."""

from __future__ import annotations

from redis import Redis

from inferq.broker.worker_registry import WorkerRegistry, WorkerStatus
from tests.conftest import REDIS_URL


def beat(
    key_prefix: str,
    *,
    name: str,
    model: str,
    room: bool,
    stuck: str | None = None,
    redis_url: str = REDIS_URL,
) -> None:
    """A heartbeat of worker `name`, which serves `model` (it lapses as a real one does)."""
    redis = Redis.from_url(redis_url)
    try:
        WorkerRegistry(redis, key_prefix=key_prefix).beat(
            WorkerStatus(
                name=name,
                model=model,
                started_at="2026-11-26T00:00:00+00:00",
                jobs_held=0,
                sequences_in_flight=0,
                engine_restarts=0,
                jobs_last_minute=0,
                prompt_tokens_last_minute=0,
                generated_tokens_last_minute=0,
                room=room,
                stuck=stuck,
            )
        )
    finally:
        redis.close()
