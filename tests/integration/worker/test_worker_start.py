"""A GPU worker that cannot start says why in one line and exits, before loading anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import new_key_prefix, service_env
from tests.helpers.processes import INFERQ


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
