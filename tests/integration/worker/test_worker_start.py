"""A GPU worker that cannot start says why in one line and exits, before loading anything;
one that can makes its model known before it loads, so work for it is queued, never refused."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from inferq.domain.jobs import JobStatus
from inferq.store.database import make_database, make_sessions
from inferq.store.served_models import ModelStore
from tests.conftest import DeploymentFactory, new_key_prefix, service_env
from tests.helpers.processes import INFERQ, log_contains


def _worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    return subprocess.run(
        [*INFERQ, "worker", "--name", "doomed@test"],
        env={**base, **env, "INFERQ_WORKER_METRICS_PORT": "0"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_worker_with_a_model_that_is_not_there_names_the_setting(
    database_url: str, tmp_path: Path
) -> None:
    missing = tmp_path / "no-model-here"
    env = service_env(model=missing, database_url=database_url, key_prefix=new_key_prefix())
    done = _worker(env)
    assert done.returncode == 2
    assert "Traceback" not in done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"inferq: cannot read the model '{missing}'")
    assert last.endswith(
        "set INFERQ_MODEL to a local model directory or a Hugging Face id this host can "
        "download (HF_TOKEN for a gated one)"
    )
    assert "loading" not in done.stderr  # vLLM was never asked to load it
    assert _served(database_url) == []  # nor was its model announced, to queue work forever


def test_a_worker_whose_context_exceeds_the_model_names_the_setting(
    database_url: str, tiny_model: Path
) -> None:
    env = service_env(model=tiny_model, database_url=database_url, key_prefix=new_key_prefix())
    done = _worker({**env, "INFERQ_MAX_MODEL_LEN": "4096"})
    assert done.returncode == 2
    assert "Traceback" not in done.stdout + done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "inferq: INFERQ_MAX_MODEL_LEN=4096 is longer than the model's context (1024 tokens): "
        "lower it, or leave it unset for the model's own"
    )


def _served(database_url: str) -> list[str]:
    engine = make_database(database_url, pool_size=1)
    try:
        return [m.name for m in ModelStore(make_sessions(engine)).all()]
    finally:
        engine.dispose()


@pytest.mark.engine
def test_work_sent_while_the_only_worker_loads_its_model_is_accepted_and_runs(
    deployment: DeploymentFactory,
) -> None:
    deployed = deployment(registered=False)  # a fresh deployment: no model known yet
    name = deployed.env["INFERQ_SERVED_MODEL_NAME"]
    worker = deployed.start_worker("gpu-a", wait=False)
    # It says so before it asks vLLM to load the model (seconds, even for the tiny one).
    worker.wait_until(log_contains(worker, "announced"), timeout_s=120, what="announcing")
    with worker.frozen():  # still loading, for as long as the submissions take
        assert not log_contains(worker, " ready.")()
        assert [m.name for m in deployed.models.all()] == [name]
        ids = deployed.submit(
            [{"model": name, "prompt": f"early {i}", "max_tokens": 4} for i in range(3)]
        )
        with deployed.client() as client:
            unknown = client.post("/v1/jobs", json={"model": "never-named", "prompt": "hi"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"

    jobs = deployed.wait_all_ended(ids)
    assert [j.status for j in jobs] == [JobStatus.SUCCEEDED] * 3
    assert all(j.result is not None and j.result.completion_tokens == 4 for j in jobs)


def test_migrate_can_make_the_model_known_before_any_worker_starts(
    database_url: str, tiny_model: Path
) -> None:
    env = service_env(model=tiny_model, database_url=database_url, key_prefix=new_key_prefix())
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}

    def migrate() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*INFERQ, "migrate", "--announce-model"],
            env={**base, **env, "INFERQ_SERVED_MODEL_NAME": "early"},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )

    assert migrate().stdout.splitlines()[-1] == "announced: early"
    assert _served(database_url) == ["early"]
    # Again (each `docker compose up`): nothing changes.
    assert migrate().stdout.splitlines()[-1] == "announced: none new (early is known already)"
