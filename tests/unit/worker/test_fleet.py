"""What a worker's peers took while it took nothing counts as work that waited for it."""

from __future__ import annotations

import dataclasses

from inferq.broker.worker_registry import WorkerRegistry, WorkerStatus
from worker.fleet import PeerBacklog

ME = "gpu-a@host"
BASE = WorkerStatus(
    name=ME,
    model="m",
    started_at="2026-11-28T00:00:00+00:00",
    jobs_held=0,
    sequences_in_flight=0,
    engine_restarts=0,
    jobs_last_minute=0,
    prompt_tokens_last_minute=0,
    generated_tokens_last_minute=0,
)


class Registry(WorkerRegistry):
    """Heartbeats set by the test."""

    def __init__(self) -> None:
        self.statuses: dict[str, WorkerStatus] = {}

    def online(self) -> list[WorkerStatus]:
        return list(self.statuses.values())

    def said(self, name: str, taken: int, **extra: str) -> None:
        self.statuses[name] = dataclasses.replace(BASE, name=name, taken=taken, **extra)


def test_what_peers_took_since_the_worker_last_took_work_is_its_backlog() -> None:
    registry = Registry()
    backlog = PeerBacklog(registry, name=ME, model="m", runner="generate")
    registry.said(ME, 5)
    registry.said("gpu-b@host", 100)
    registry.said("gpu-c@host", 40)
    assert backlog(5) == 0  # the first reading counts from now
    registry.said("gpu-b@host", 130)
    registry.said("gpu-c@host", 45)
    assert backlog(5) == 35
    registry.said("gpu-b@host", 150)
    assert backlog(5) == 55  # it grows while this worker takes nothing
    assert backlog(6) == 0  # it took one: counted from here again
    registry.said("gpu-b@host", 151)
    assert backlog(6) == 1


def test_only_peers_of_the_same_model_and_runner_count_and_a_restart_counts_from_zero() -> None:
    registry = Registry()
    backlog = PeerBacklog(registry, name=ME, model="m", runner="generate")
    registry.said("other-model@host", 10, model="other")
    registry.said("embedder@host", 10, runner="pooling")
    registry.said("gpu-b@host", 50)
    assert backlog(0) == 0
    registry.said("other-model@host", 90, model="other")
    registry.said("embedder@host", 90, runner="pooling")
    registry.said("gpu-b@host", 3)  # restarted, and took 3 since
    assert backlog(0) == 3
    registry.said("gpu-d@host", 7)  # a new peer counts from when it is first seen
    assert backlog(0) == 3
    registry.said("gpu-d@host", 9)
    assert backlog(0) == 5
