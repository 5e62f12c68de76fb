"""Heartbeats read across releases, as during a rolling upgrade."""

from __future__ import annotations

import json

import redis

from inferq.broker.worker_registry import WORKERS_KEY, WorkerRegistry
from tests.conftest import REDIS_URL, delete_keys, new_key_prefix


def test_a_heartbeat_from_a_newer_worker_is_read_without_the_fields_it_added() -> None:
    prefix = new_key_prefix()
    client = redis.Redis.from_url(REDIS_URL)
    newer = {
        "name": "gpu-1@test",
        "model": "m",
        "started_at": "2026-11-26T00:00:00+00:00",
        "jobs_held": 3,
        "sequences_in_flight": 2,
        "engine_restarts": 0,
        "jobs_last_minute": 5,
        "prompt_tokens_last_minute": 50,
        "generated_tokens_last_minute": 80,
        "a_field_of_a_later_release": {"anything": 1},
    }
    try:
        client.set(prefix + WORKERS_KEY + newer["name"], json.dumps(newer))
        [status] = WorkerRegistry(client, key_prefix=prefix).online()
        assert (status.name, status.jobs_held, status.jobs_last_minute) == ("gpu-1@test", 3, 5)
    finally:
        delete_keys(prefix)
        client.close()
