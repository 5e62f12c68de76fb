"""What the API says of the fleet when something waits forever: a stuck worker in
`/v1/status`, and maintenance's count of stuck jobs on `/metrics`. Heartbeats and the
counts are written into Redis as a worker and maintenance write them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redis import Redis

from inferq.broker.stuck_jobs import StuckJobs
from tests.conftest import ADMIN_KEY, REDIS_URL, service_env
from tests.helpers.heartbeats import beat
from tests.helpers.metrics import scrape
from tests.helpers.processes import free_port, start_api

WHY = "20 waiting, room to take them, and nothing taken for 121 s"


@pytest.fixture
def api(database_url: str, tiny_model: Path, key_prefix: str, tmp_path: Path) -> Iterator[str]:
    """An API of its own (no worker): its URL."""
    port = free_port()
    env = service_env(model=tiny_model, database_url=database_url, key_prefix=key_prefix)
    process = start_api(env=env, port=port, log_dir=tmp_path)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.stop()


def test_status_names_a_stuck_worker_and_says_why(api: str, key_prefix: str) -> None:
    beat(key_prefix, name="gpu-a@test", model="tiny", room=True, stuck=WHY)
    beat(key_prefix, name="gpu-b@test", model="tiny", room=False)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    workers = httpx.get(f"{api}/v1/status", headers=headers, timeout=10).json()["workers"]
    assert {w["name"]: (w["room"], w["stuck"]) for w in workers} == {
        "gpu-a@test": (True, WHY),
        "gpu-b@test": (False, None),
    }


def test_metrics_show_the_jobs_maintenance_last_found_stuck(api: str, key_prefix: str) -> None:
    assert not any(name == "inferq_jobs_stalled" for name, _ in scrape(f"{api}/metrics"))
    redis = Redis.from_url(REDIS_URL)
    try:
        StuckJobs(redis, key_prefix=key_prefix).record({"tiny": 3, "other": 0}, ttl_s=45)
    finally:
        redis.close()
    samples = scrape(f"{api}/metrics")
    assert samples[("inferq_jobs_stalled", (("model", "tiny"),))] == 3
    assert samples[("inferq_jobs_stalled", (("model", "other"),))] == 0
