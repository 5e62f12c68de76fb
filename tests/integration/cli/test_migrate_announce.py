"""`inferq migrate` makes the models of INFERQ_ANNOUNCE_MODELS known, as a Kubernetes
deployment's migrate Job runs it: the API of a fresh deployment then accepts their work
before any of their workers is up (it waits in their queues)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx

from inferq.domain.served_models import ServedModel
from inferq.store.database import make_database, make_sessions
from inferq.store.served_models import ModelStore
from tests.conftest import ADMIN_KEY, service_env
from tests.helpers.processes import INFERQ, free_port, start_api


def test_a_fresh_deployment_accepts_work_for_the_announced_models_before_any_worker(
    database_url: str, tiny_model: Path, key_prefix: str, tmp_path: Path
) -> None:
    env = service_env(model=tiny_model, database_url=database_url, key_prefix=key_prefix)
    # Every process reads the same configuration (a ConfigMap): no model of its own, the
    # served ones listed once.
    del env["INFERQ_MODEL"], env["INFERQ_SERVED_MODEL_NAME"]
    announced = {"early": {"model": str(tiny_model), "max_model_len": 512}}
    env["INFERQ_ANNOUNCE_MODELS"] = json.dumps(announced)
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}

    def migrate() -> str:
        done = subprocess.run(
            [*INFERQ, "migrate"],
            env={**base, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout.splitlines()[-1]

    port = free_port()
    api = start_api(env=env, port=port, log_dir=tmp_path)
    job = {"model": "early", "prompt": "hi", "max_tokens": 1}
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    try:
        # The first request for a model loads its tokenizer: seconds, more on a busy host.
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=120
        ) as client:
            before = client.post("/v1/jobs", json=job)
            assert migrate() == "announced: early"
            after = client.post("/v1/jobs", json=job)
            waiting = client.get(f"/v1/jobs/{after.json()['id']}").json()
    finally:
        api.stop()
    assert before.status_code == 404
    assert before.json()["error"]["code"] == "model_not_found"
    assert after.status_code == 202
    assert waiting["status"] == "queued"
    [model] = _served(database_url)
    assert (model.name, model.base, model.runner) == ("early", "early", "generate")
    assert (model.tokenizer, model.max_model_len) == (str(tiny_model), 512)
    # Again (the Job is re-run on each upgrade): nothing changes.
    assert migrate() == "announced: none new (early is known already)"


def _served(database_url: str) -> list[ServedModel]:
    engine = make_database(database_url, pool_size=1)
    try:
        return ModelStore(make_sessions(engine)).all()
    finally:
        engine.dispose()
