"""`inferq doctor` against real Postgres, Redis and a running stack."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from tests.conftest import Stack, new_key_prefix, service_env
from tests.helpers.heartbeats import beat
from tests.helpers.processes import INFERQ, free_port


def _doctor(env: dict[str, str]) -> tuple[int, dict[str, str]]:
    """Exit status, and each check's line by its name."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("INFERQ_")}
    done = subprocess.run(
        [*INFERQ, "doctor"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = {}
    for line in done.stdout.splitlines():
        verdict, name, detail = line.split(maxsplit=2) if " port " not in line else _port(line)
        lines[name] = f"{verdict} {detail}"
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.returncode, lines


def _port(line: str) -> tuple[str, str, str]:
    verdict, _, number, detail = line.split(maxsplit=3)
    return verdict, f"port {number}", detail


def test_doctor_passes_what_works_and_says_how_to_fix_what_does_not(
    database_url: str, tiny_model: Path
) -> None:
    api_port, flower_port = free_port(), free_port()
    env = service_env(model=tiny_model, database_url=database_url, key_prefix=new_key_prefix())
    env.update(
        INFERQ_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        INFERQ_API_HOST="127.0.0.1",
        INFERQ_API_PORT=str(api_port),
        INFERQ_FLOWER_PORT=str(flower_port),
        INFERQ_WORKER_METRICS_PORT="0",
    )
    with socket.socket() as squatter:  # another program on the API's port
        squatter.bind(("127.0.0.1", api_port))
        squatter.listen()
        status, lines = _doctor(env)

    assert status == 1
    assert lines["postgres"].startswith("ok ")
    assert "schema at" in lines["postgres"]
    assert lines["redis"].startswith("FAIL ")
    assert "start Redis there, or set INFERQ_REDIS_URL" in lines["redis"]
    assert lines["workers"] == "FAIL unknown: Redis is down"
    assert lines["model"].startswith("ok ")
    assert "2 layers, context 1024" in lines["model"]
    # The tests' engine: 16 sequences for batch lines and 2 for single jobs, of 1,024
    # tokens, sized whatever the host's layout.
    assert lines["memory"].startswith("ok KV cache 36 MiB: 18 sequences of 1024 tokens")
    assert lines[f"port {api_port}"] == (
        "FAIL in use by another program, needed for the API: stop it, or set INFERQ_API_PORT"
    )
    assert lines[f"port {flower_port}"] == "ok free for Flower"


def test_doctor_on_a_running_deployment_sees_its_workers_and_services(stack: Stack) -> None:
    api_port = stack.url.rsplit(":", 1)[1]
    metrics_port = stack.worker.metrics_url.rsplit(":", 1)[1].split("/")[0]
    env = {
        **stack.env,
        "INFERQ_API_PORT": api_port,
        "INFERQ_WORKER_METRICS_PORT": metrics_port,
        "INFERQ_FLOWER_PORT": str(free_port()),
    }
    status, lines = _doctor(env)
    assert status == 0, lines
    assert lines["redis"].startswith("ok ")
    assert lines["workers"].startswith("ok 1 online: worker@test (tiny)")
    assert lines["models"] == "ok tiny (1 worker)"
    assert lines[f"port {api_port}"] == "ok already serving the API"
    assert lines[f"port {metrics_port}"] == "ok already serving the worker's metrics"


def test_doctor_names_a_stuck_worker_and_says_why_and_what_to_do(
    database_url: str, tiny_model: Path, key_prefix: str
) -> None:
    why = "20 waiting, room to take them, and nothing taken for 121 s"
    beat(key_prefix, name="gpu-a@host", model="tiny", room=True, stuck=why)
    beat(key_prefix, name="gpu-b@host", model="tiny", room=False)
    env = service_env(model=tiny_model, database_url=database_url, key_prefix=key_prefix)
    env.update(
        INFERQ_API_PORT=str(free_port()),
        INFERQ_FLOWER_PORT=str(free_port()),
        INFERQ_WORKER_METRICS_PORT="0",
    )
    status, lines = _doctor(env)
    assert status == 1
    assert lines["workers"] == (
        f"FAIL 1 of 2 online stuck: gpu-a@host (tiny) is stuck: {why}. A stuck worker "
        "consumes its queues again, then exits (code 72) if still stuck INFERQ_STALL_S later: "
        "see that its supervisor starts it again, and if it comes back stuck, read its log "
        "and check its connection to Redis"
    )
