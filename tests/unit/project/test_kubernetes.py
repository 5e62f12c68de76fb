"""deploy/k8s cannot run here (no cluster): every manifest is validated against the
Kubernetes schemas, and checked against the code and compose.yaml (the same commands,
settings, probes and queue names)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import typer.main
import yaml

from cli.main import app
from inferq.domain.queue_names import gpu_queues
from inferq.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes release still supported upstream when this was written.
KUBERNETES = "1.33.0"

Manifest = dict[str, Any]


def _kustomization() -> Manifest:
    data: Manifest = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    return data


@pytest.fixture(scope="module")
def manifests() -> list[Manifest]:
    found: list[Manifest] = []
    for name in _kustomization()["resources"]:
        found += [doc for doc in yaml.safe_load_all((K8S / name).read_text()) if doc]
    return found


def _of_kind(manifests: list[Manifest], kind: str) -> dict[str, Manifest]:
    return {m["metadata"]["name"]: m for m in manifests if m["kind"] == kind}


def _containers(manifests: list[Manifest]) -> dict[str, Manifest]:
    found = {}
    for manifest in manifests:
        if manifest["kind"] in {"Deployment", "Job"}:
            for container in manifest["spec"]["template"]["spec"]["containers"]:
                found[manifest["metadata"]["name"]] = container
    return found


def test_every_file_is_in_the_kustomization_and_every_resource_exists() -> None:
    listed = set(_kustomization()["resources"])
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk


def test_every_manifest_but_keda_s_is_valid_kubernetes(manifests: list[Manifest]) -> None:
    for manifest in manifests:
        if manifest["apiVersion"].startswith("keda.sh/"):
            continue  # a custom resource: checked below
        # Strict: an unknown or misspelt field is an error, not silently ignored.
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)


def test_the_validation_catches_a_misspelt_field(manifests: list[Manifest]) -> None:
    [api] = [
        m for m in manifests if m["metadata"]["name"] == "inferq-api" and m["kind"] == "Deployment"
    ]
    broken = {**api, "spec": {**api["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES, strict=True)


def test_every_command_and_health_check_is_a_real_entry_point(manifests: list[Manifest]) -> None:
    commands = set(typer.main.get_command(app).commands)  # type: ignore[attr-defined]
    used = set()
    for name, container in _containers(manifests).items():
        assert container["command"][0] == "inferq", name
        assert container["command"][1] in commands, name
        used.add(container["command"][1])
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            command = container.get(probe, {}).get("exec", {}).get("command", [])
            if command and command[0] == "inferq":
                assert command[1] in commands, f"{name}'s {probe} runs unknown inferq {command[1]}"
    assert {"api", "worker", "migrate", "webhooks", "beat", "flower"} <= used


def test_every_inferq_variable_is_a_real_setting(manifests: list[Manifest]) -> None:
    known = {f"INFERQ_{name.upper()}" for name in Settings.model_fields}
    variables = set(_of_kind(manifests, "ConfigMap")["inferq-config"]["data"])
    for container in _containers(manifests).values():
        variables |= {variable["name"] for variable in container.get("env", [])}
    assert {v for v in variables if v.startswith("INFERQ_")} <= known
    # Every container reads the same configuration and secrets.
    for name, container in _containers(manifests).items():
        sources = [next(iter(s.values()))["name"] for s in container["envFrom"]]
        assert sources == ["inferq-config", "inferq-secrets"], name


def test_probes_ask_what_compose_s_healthchecks_ask(manifests: list[Manifest]) -> None:
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    containers = _containers(manifests)
    api = containers["inferq-api"]
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "/readyz" in compose["api"]["healthcheck"]["test"][-1]
    worker = containers["inferq-worker-llama"]
    assert worker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert "9400/readyz" in compose["worker"]["healthcheck"]["test"][-1]
    # Alive unless stuck (a worker that takes nothing while work waits is restarted).
    assert worker["livenessProbe"]["httpGet"]["path"] == "/livez"
    webhooks = containers["inferq-webhooks"]
    assert (
        webhooks["livenessProbe"]["exec"]["command"]
        == compose["webhooks"]["healthcheck"]["test"][1:]
    )
    beat = containers["inferq-beat"]
    assert beat["livenessProbe"]["exec"]["command"] == compose["beat"]["healthcheck"]["test"][1:]


def test_a_worker_per_gpu_that_drains_before_it_is_killed(manifests: list[Manifest]) -> None:
    drain_s = Settings.model_fields["drain_timeout_s"].default
    for name, deployment in _of_kind(manifests, "Deployment").items():
        if not name.startswith("inferq-worker-"):
            continue
        spec = deployment["spec"]["template"]["spec"]
        assert spec["terminationGracePeriodSeconds"] > drain_s
        [container] = spec["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    beat = _of_kind(manifests, "Deployment")["inferq-beat"]["spec"]
    assert (beat["replicas"], beat["strategy"]["type"]) == (1, "Recreate")  # exactly one


def test_each_model_s_workers_scale_on_that_model_s_queues(manifests: list[Manifest]) -> None:
    deployments = _of_kind(manifests, "Deployment")
    scaled = _of_kind(manifests, "ScaledObject")
    workers = {name for name in deployments if name.startswith("inferq-worker-")}
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled.values()} == workers
    prefix = Settings.model_fields["redis_key_prefix"].default
    for scaled_object in scaled.values():
        target = deployments[scaled_object["spec"]["scaleTargetRef"]["name"]]
        [container] = target["spec"]["template"]["spec"]["containers"]
        env = {v["name"]: v.get("value") for v in container["env"]}
        model = env["INFERQ_SERVED_MODEL_NAME"]
        triggers = scaled_object["spec"]["triggers"]
        assert {t["type"] for t in triggers} == {"redis"}
        assert sorted(t["metadata"]["listName"] for t in triggers) == sorted(
            prefix + queue for queue in gpu_queues(model)
        )
        config = _of_kind(manifests, "ConfigMap")["inferq-config"]["data"]
        for trigger in triggers:
            # KEDA reads the address from the scale target's environment.
            assert trigger["metadata"]["addressFromEnv"] in config
            assert int(trigger["metadata"]["listLength"]) > 0
