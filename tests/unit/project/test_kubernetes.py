"""deploy/k8s cannot run here (no cluster): every manifest is validated against the
Kubernetes schemas, and checked against the code and compose.yaml (the same commands,
settings, probes, queue names and served models)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import typer.main
import yaml

from cli.main import app
from inferq.domain.queue_names import gpu_queues
from inferq.domain.served_models import announced_by, served_by
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
    kustomization = _kustomization()
    listed = set(kustomization["resources"]) | set(kustomization["configurations"])
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


def _settings(variables: dict[str, str]) -> Settings:
    """The settings a process with these INFERQ_* variables reads."""
    return Settings(
        **{k.removeprefix("INFERQ_").lower(): v for k, v in variables.items() if k[:7] == "INFERQ_"}
    )


def _workers(manifests: list[Manifest]) -> dict[str, Settings]:
    """Each worker Deployment's settings: the ConfigMap's, and its own on top."""
    config = _of_kind(manifests, "ConfigMap")["inferq-config"]["data"]
    found = {}
    for name, container in _containers(manifests).items():
        if name.startswith("inferq-worker-"):
            own = {v["name"]: v["value"] for v in container["env"] if "value" in v}
            found[name] = _settings({**config, **own})
    return found


def test_each_model_s_workers_scale_on_that_model_s_jobs_in_postgres(
    manifests: list[Manifest],
) -> None:
    scaled = _of_kind(manifests, "ScaledObject")
    workers = _workers(manifests)
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled.values()} == set(workers)
    config = _of_kind(manifests, "ConfigMap")["inferq-config"]["data"]
    database = urlsplit(config["INFERQ_DATABASE_URL"])
    auths = _of_kind(manifests, "TriggerAuthentication")
    for scaled_object in scaled.values():
        settings = workers[scaled_object["spec"]["scaleTargetRef"]["name"]]
        [trigger] = scaled_object["spec"]["triggers"]
        assert trigger["type"] == "postgresql"
        metadata = trigger["metadata"]
        # The model's own queues, which its adapters' jobs use too (the query itself runs
        # against a real Postgres in tests/integration/inferq/test_scaling_query.py).
        query = " ".join(metadata["query"].split())
        queues = ", ".join(f"'{queue}'" for queue in gpu_queues(settings.model_name))
        active = "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')"
        assert query == f"{active} AND queue IN ({queues})"
        # A worker per engine's worth of jobs.
        assert int(metadata["targetQueryValue"]) == settings.max_num_seqs
        # The database the inferq containers use, from KEDA's namespace.
        namespace = _kustomization()["namespace"]
        assert metadata["host"] == f"{database.hostname}.{namespace}.svc.cluster.local"
        assert (metadata["port"], metadata["userName"], metadata["dbName"]) == (
            str(database.port),
            database.username,
            database.path.removeprefix("/"),
        )
        assert trigger["authenticationRef"]["name"] in auths


def test_keda_signs_in_with_the_password_the_containers_use(manifests: list[Manifest]) -> None:
    [auth] = _of_kind(manifests, "TriggerAuthentication").values()
    [password] = auth["spec"]["secretTargetRef"]
    api = _containers(manifests)["inferq-api"]
    [reference] = [v for v in api["env"] if v["name"] == "INFERQ_DATABASE_PASSWORD"]
    secret = reference["valueFrom"]["secretKeyRef"]
    assert password == {"parameter": "password", "name": secret["name"], "key": secret["key"]}
    # kustomize renames the generated secret, and what names it where it is told to look.
    [generated] = _kustomization()["secretGenerator"]
    assert generated["name"] == secret["name"]
    [configuration] = _kustomization()["configurations"]
    renamed = yaml.safe_load((K8S / configuration).read_text())["nameReference"]
    assert {
        "kind": "Secret",
        "fieldSpecs": [{"kind": "TriggerAuthentication", "path": "spec/secretTargetRef/name"}],
    } in renamed


def test_every_served_model_is_announced_by_the_migrate_job_as_its_workers_announce_it(
    manifests: list[Manifest],
) -> None:
    config = _of_kind(manifests, "ConfigMap")["inferq-config"]["data"]
    # The Job runs plain `inferq migrate`, which announces what INFERQ_ANNOUNCE_MODELS lists.
    migrate = _containers(manifests)["inferq-migrate"]
    assert migrate["command"] == ["inferq", "migrate"]
    assert "INFERQ_ANNOUNCE_MODELS" not in {v["name"] for v in migrate.get("env", [])}
    announced = {model.name: model for model in announced_by(_settings(config))}
    by_workers = {
        model.name: model for worker in _workers(manifests).values() for model in served_by(worker)
    }
    assert announced == by_workers
