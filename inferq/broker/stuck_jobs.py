"""How many jobs of each served model maintenance last found stuck: queued for longer
than `INFERQ_STALL_S` while workers online for the model had room to take them.

Maintenance counts them once a pass and writes the counts here, to expire after a few
passes; each API process reads them when Prometheus scrapes (`inferq_jobs_stalled`).
Counting once, where the warning is logged, keeps the log and the gauge in step and costs
Postgres one query a pass rather than one per scrape of each API process; if maintenance
stops, the counts expire rather than standing still (and `inferq health maintenance`
fails).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import cast

from redis import Redis
from redis.exceptions import RedisError

from inferq.constants import JOBS_STUCK_KEY
from inferq.exceptions import BrokerUnavailable


class StuckJobs:
    def __init__(self, redis: Redis, *, key_prefix: str) -> None:
        self._redis = redis
        self._key = key_prefix + JOBS_STUCK_KEY

    def record(self, counts: Mapping[str, int], *, ttl_s: float) -> None:
        """Replace the counts (every served model's, zeros too) for `ttl_s` seconds."""
        try:
            self._redis.set(self._key, json.dumps(dict(counts)), px=max(1, int(ttl_s * 1000)))
        except RedisError as exc:
            raise BrokerUnavailable(f"could not record stuck jobs in Redis: {exc}") from exc

    def counts(self) -> dict[str, int]:
        """The counts by served model; empty if maintenance has recorded none lately."""
        try:
            # redis-py types its sync client as sync-or-async; this one is sync.
            raw = cast("bytes | None", self._redis.get(self._key))
        except RedisError as exc:
            raise BrokerUnavailable(f"could not read stuck jobs from Redis: {exc}") from exc
        return {} if raw is None else {str(k): int(v) for k, v in json.loads(raw).items()}
