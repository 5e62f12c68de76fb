"""Which GPU workers are online: each one keeps a short-lived heartbeat key in Redis."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, cast

from redis import Redis
from redis.exceptions import RedisError

from inferq.exceptions import BrokerUnavailable

WORKERS_KEY = "workers:"
HEARTBEAT_EVERY_S = 5
HEARTBEAT_TTL_S = 20


@dataclass(frozen=True, kw_only=True)
class WorkerStatus:
    """What a GPU worker says about itself every few seconds."""

    name: str
    model: str
    # `generate` or `pooling` (embeddings), and the LoRA adapters it serves on `model`.
    runner: str = "generate"
    adapters: list[str] = field(default_factory=list)
    gpus: list[str] = field(default_factory=list)
    started_at: str
    jobs_held: int
    sequences_in_flight: int
    engine_restarts: int
    jobs_last_minute: int
    prompt_tokens_last_minute: int
    generated_tokens_last_minute: int
    # Defaults, so a heartbeat from a worker of an earlier release still reads.
    room: bool = False  # it could take another message now (inferq/host/stall.py)
    stuck: str | None = None  # why its stall watch holds it stuck, while it does
    taken: int = 0  # messages it has taken since it started (worker/fleet.py)


class WorkerRegistry:
    def __init__(self, redis: Redis, *, key_prefix: str) -> None:
        self._redis = redis
        self._prefix = key_prefix + WORKERS_KEY

    def beat(self, status: WorkerStatus) -> None:
        self._redis.set(self._prefix + status.name, json.dumps(asdict(status)), ex=HEARTBEAT_TTL_S)

    def leave(self, name: str) -> None:
        self._redis.delete(self._prefix + name)

    def online(self) -> list[WorkerStatus]:
        try:
            keys = sorted(self._redis.scan_iter(match=self._prefix + "*", count=500))
            # redis-py types its sync client as sync-or-async; this one is sync.
            values = cast(list[Any], self._redis.mget(keys)) if keys else []
        except RedisError as exc:
            raise BrokerUnavailable(f"could not read worker heartbeats from Redis: {exc}") from exc
        return [_status(json.loads(v)) for v in values if v is not None]


def _status(said: dict[str, Any]) -> WorkerStatus:
    """A heartbeat as this release reads it: fields a newer worker adds are left out, so
    an API or housekeeper not yet upgraded still reads it during a rolling upgrade."""
    known = {f.name for f in fields(WorkerStatus)}
    return WorkerStatus(**{name: value for name, value in said.items() if name in known})
