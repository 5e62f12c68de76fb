"""compose.yaml cannot run here (no Docker engine), so it is checked against the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml

from cli.main import app
from inferq.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return data


def _services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = compose["services"]
    return services


def test_every_inferq_command_is_a_real_entry_point(compose: dict[str, Any]) -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    used = set()
    for name, service in _services(compose).items():
        command = service.get("command", [])
        if command and command[0] == "inferq":
            assert command[1] in commands, f"{name} runs unknown `inferq {command[1]}`"
            used.add(command[1])
    assert {"api", "worker", "migrate", "webhooks", "beat", "flower"} <= used


def test_every_inferq_variable_is_a_real_setting(compose: dict[str, Any]) -> None:
    known = {f"INFERQ_{name.upper()}" for name in Settings.model_fields}
    for name, service in _services(compose).items():
        for variable in service.get("environment", {}) or {}:
            if variable.startswith("INFERQ_"):
                assert variable in known, f"{name} sets {variable}, which no setting reads"


def test_dependencies_exist_and_migrations_run_first(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name, service in services.items():
        for dependency in service.get("depends_on", {}) or {}:
            assert dependency in services, f"{name} depends on missing {dependency}"
    for name in ("api", "worker", "worker-cpu"):
        assert services[name]["depends_on"]["migrate"] == {
            "condition": "service_completed_successfully"
        }
    # And makes the model known: the API queues its work before the worker is up.
    assert services["migrate"]["command"] == ["inferq", "migrate", "--announce-model"]


def test_redis_keeps_its_data_and_never_evicts(compose: dict[str, Any]) -> None:
    command = _services(compose)["redis"]["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_the_gpu_worker_reserves_a_gpu_and_the_cpu_worker_is_a_profile(
    compose: dict[str, Any],
) -> None:
    services = _services(compose)
    [device] = services["worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"]
    assert "profiles" not in services["worker"]
    assert services["worker-cpu"]["profiles"] == ["cpu"]


def test_nothing_runs_open(compose: dict[str, Any]) -> None:
    services = _services(compose)
    for name, service in services.items():
        environment = service.get("environment", {}) or {}
        assert environment.get("INFERQ_AUTH_ENABLED", "true") != "false", name
        assert "INFERQ_ENVIRONMENT" not in environment, name
    flower = services["flower"]
    assert flower["command"] == ["inferq", "flower"]
    # `:?` makes compose refuse to start without credentials.
    assert ":?" in flower["environment"]["INFERQ_FLOWER_BASIC_AUTH"]


def test_every_long_running_service_has_a_health_check(compose: dict[str, Any]) -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    for name, service in _services(compose).items():
        if name == "migrate":
            continue
        test = service.get("healthcheck", {}).get("test")
        assert test, f"{name} has no health check"
        if test[1] == "inferq":
            assert test[2] in commands, f"{name}'s health check runs unknown `inferq {test[2]}`"


def test_workers_get_longer_to_stop_than_their_drain(compose: dict[str, Any]) -> None:
    drain_s = Settings.model_fields["drain_timeout_s"].default
    for name in ("worker", "worker-cpu"):
        grace = _services(compose)[name]["stop_grace_period"]
        assert grace.endswith("m")
        assert int(grace[:-1]) * 60 > drain_s
