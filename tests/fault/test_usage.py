"""Usage stays exact when a GPU worker is killed in the middle of a batch (the lines it held
run again elsewhere, and count once), and when retention deletes the jobs it was made of."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from openai import OpenAI
from sqlalchemy import func, select

from housekeeper.retention import Retention
from inferq.domain.jobs import JobStatus
from inferq.store.models import JobRow
from inferq.store.retention import RetentionStore
from tests.fault.conftest import DeploymentFactory

pytestmark = pytest.mark.engine

LINES = 48
SINGLE = 16
TOKENS = 120


def _usage(url: str, key: str) -> list[dict[str, Any]]:
    response = httpx.get(
        url + "/v1/usage",
        params={"group_by": "model,api_key_id,tenant"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return [r for bucket in response.json()["data"] for r in bucket["results"]]


def test_usage_counts_each_line_once_through_a_killed_worker_and_outlives_retention(
    deployment: DeploymentFactory,
) -> None:
    deployed = deployment()
    client = OpenAI(base_url=deployed.url + "/v1", api_key=deployed.admin_key, max_retries=2)
    lines = [
        {
            "custom_id": f"line-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"line {i}"}],
                "max_tokens": TOKENS,
                "ignore_eos": True,
            },
        }
        for i in range(LINES)
    ]
    uploaded = client.files.create(
        file=("in.jsonl", io.BytesIO("\n".join(map(json.dumps, lines)).encode())),
        purpose="batch",
    )
    batch = client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_body={"output_expires_after": {"anchor": "created_at", "seconds": 3600}},
    )
    singles = deployed.submit(
        [{"prompt": f"job {i}", "max_tokens": TOKENS, "ignore_eos": True} for i in range(SINGLE)]
    )
    with deployed.sessions() as session:
        line_ids = list(session.scalars(select(JobRow.id).where(JobRow.batch_id == batch.id)))
    everything = line_ids + singles

    first = deployed.start_worker("gpu-a", INFERQ_MAX_NUM_SEQS="8", INFERQ_MAX_BATCH_SIZE="4")
    deployed.wait_done_and_running(everything, 8)
    assert deployed.kill_holding_running_jobs(first, everything) > 0
    deployed.start_worker("gpu-b", INFERQ_MAX_NUM_SEQS="8", INFERQ_MAX_BATCH_SIZE="4")
    jobs = deployed.wait_all_ended(everything)
    assert {j.status for j in jobs} == {JobStatus.SUCCEEDED}
    assert max(j.attempts for j in jobs) == 2  # the killed worker's lines ran again

    with deployed.sessions() as session:
        prompt_tokens = session.scalar(
            select(func.sum(JobRow.prompt_tokens)).where(JobRow.id.in_(everything))
        )
    (counted,) = _usage(deployed.url, deployed.admin_key)
    assert counted["model"] == "tiny"
    assert counted["batch_lines"] == LINES
    assert counted["jobs"] == SINGLE
    assert counted["batches"] == 1
    assert counted["output_tokens"] == (LINES + SINGLE) * TOKENS
    assert counted["input_tokens"] == prompt_tokens

    # Retention, a day later, deletes every job of them; what they used stays.
    later = datetime.now(UTC) + timedelta(days=1)
    retention = Retention(
        RetentionStore(deployed.sessions, clock=lambda: later),
        job_retention_s=3600,
        webhook_retention_s=3600,
        clock=lambda: later,
    )
    while retention.run_once().unfinished:
        pass
    with deployed.sessions() as session:
        assert session.scalar(select(func.count()).where(JobRow.id.in_(everything))) == 0
    assert _usage(deployed.url, deployed.admin_key) == [counted]
