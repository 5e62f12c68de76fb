"""The chaos run's fault injector: at random intervals drawn from a seed, one fault of a
kind drawn the same way, each logged with when it began and ended.

| kind | what it does |
|---|---|
| `kill_worker` | SIGKILL a GPU worker (and its engine core), and start it again |
| `stop_worker` | SIGSTOP a GPU worker past its lease, then SIGCONT |
| `kill_api` | SIGKILL an API process, and start it again |
| `restart_redis` | restart Redis with its data dropped |
| `restart_postgres` | an immediate shutdown of Postgres (as a crash), then a start |
| `kill_housekeeper`, `kill_beat` | SIGKILL it, and start it again a minute later |
| `poison` | submit a request that kills the engine core it enters (failed as poison) |
| `drop_receiver` | take the webhook receiver down for a while |
| `cancel_consumers` | cancel a GPU worker's queues (a third of the time the housekeeper's) |
| `thread_death` | SIGUSR1 to a busy GPU worker: its result writer's thread dies, it exits |

`cancel_consumers` goes through Celery's remote control, as an operator's `celery control
cancel_consumer` would, and nothing else is done: the process's stall watch must notice
and consume again (or exit, to be started again). `thread_death` uses the workers' fault
hook (tests/helpers/faulty_worker.py): the writer's thread raises at its next announcement
of results, and the worker exits (71); the cluster's supervision starts it again. Their
entries in the fault log say whether they fired (the node acknowledged the cancel; the
worker exited 71 in time).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.cluster import (
    HOUSEKEEPER_NODE,
    LEASE_S,
    MODEL_NAME,
    Cluster,
    worker_node,
)
from bench.chaos.load import Load
from inferq.constants import SERVICE_QUEUES
from inferq.domain.queue_names import gpu_queues
from inferq.host.supervision import EXIT_THREAD_DIED

KINDS = (
    "kill_worker",
    "stop_worker",
    "kill_api",
    "restart_redis",
    "restart_postgres",
    "kill_housekeeper",
    "kill_beat",
    "poison",
    "drop_receiver",
    "cancel_consumers",
    "thread_death",
)
SERVICE_DOWN_S = 60.0
RECEIVER_DOWN_S = (20.0, 90.0)
HOUSEKEEPER_SHARE = 1 / 3
# A worker told to lose its writer thread loses it at its next announcement of results:
# within a second under load, later if it has nothing to do.
DIE_WITHIN_S = 120.0

log = logging.getLogger(__name__)


@dataclass
class FaultLog:
    entries: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, target: str, began: float, ended: float, **detail: Any) -> None:
        self.entries.append(
            {"kind": kind, "target": target, "began": began, "ended": ended, **detail}
        )
        log.warning("fault %s on %s, %.1f s %s", kind, target, ended - began, detail or "")

    def last_ended(self) -> float | None:
        return max((e["ended"] for e in self.entries), default=None)


class Injector:
    """Runs in a thread of its own; `stop` ends it after the fault under way."""

    def __init__(
        self,
        cluster: Cluster,
        load: Load,
        loop: asyncio.AbstractEventLoop,
        *,
        seed: int,
        every_s: tuple[float, float],
        faults: FaultLog,
        kinds: tuple[str, ...] = KINDS,
    ) -> None:
        self._cluster = cluster
        self._load = load
        self._loop = loop
        self._rng = random.Random(seed)
        self._every_s = every_s
        self.faults = faults
        self._kinds = kinds
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="faults", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self._rng.uniform(*self._every_s)):
            kind = self._rng.choice(self._kinds)
            began = time.time()
            try:
                target, detail = self._inject(kind)
            except Exception as exc:  # logged in the fault log: the run goes on
                log.exception("fault %s failed", kind)
                target, detail = "?", {"fired": False, "error": repr(exc)}
            self.faults.add(kind, target, began, time.time(), **detail)

    def _inject(self, kind: str) -> tuple[str, dict[str, Any]]:
        """The fault's target, and what else its entry should say."""
        cluster = self._cluster
        index = self._rng.randrange(2)
        actions: dict[str, Callable[[], str | tuple[str, dict[str, Any]]]] = {
            "kill_worker": lambda: _done(cluster.kill_worker, index, f"gpu-{index}"),
            "stop_worker": lambda: self._stop_worker(index),
            "kill_api": lambda: _done(cluster.kill_api, index, f"api-{index}"),
            "restart_redis": lambda: _done(lambda _: cluster.restart_redis(), index, "redis"),
            "restart_postgres": lambda: _done(
                lambda _: cluster.restart_postgres(), index, "postgres"
            ),
            "kill_housekeeper": lambda: self._down_a_while(
                cluster.kill_housekeeper, cluster.start_housekeeper, "housekeeper"
            ),
            "kill_beat": lambda: self._down_a_while(cluster.kill_beat, cluster.start_beat, "beat"),
            "poison": self._poison,
            "drop_receiver": self._drop_receiver,
            "cancel_consumers": lambda: self._cancel_consumers(index),
            "thread_death": lambda: self._thread_death(index),
        }
        outcome = actions[kind]()
        return outcome if isinstance(outcome, tuple) else (outcome, {})

    def _cancel_consumers(self, index: int) -> tuple[str, dict[str, Any]]:
        housekeeper = self._rng.random() < HOUSEKEEPER_SHARE
        if housekeeper and "housekeeper" not in self._cluster.intended_down:
            name, node, queues = "housekeeper", HOUSEKEEPER_NODE, SERVICE_QUEUES
        else:
            name, node, queues = f"gpu-{index}", worker_node(index), gpu_queues(MODEL_NAME)
        replies = self._cluster.cancel_consumers(node, queues)
        # A node restarting just now does not answer: then nothing was cancelled.
        fired = all(any("ok" in r.get(node, {}) for r in reply) for reply in replies)
        return name, {"fired": fired, "replies": replies}

    def _thread_death(self, index: int) -> tuple[str, dict[str, Any]]:
        # A worker with work dies at once; one with none (its consumers cancelled, say)
        # only once work reaches it.
        if busy := self._cluster.busy_workers():
            index = self._rng.choice(busy)
        worker = self._cluster.kill_writer_thread(index)
        code = None
        if worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = worker.process.wait(DIE_WITHIN_S)
        return f"gpu-{index}", {"fired": code == EXIT_THREAD_DIED, "exit_code": code}

    def _stop_worker(self, index: int) -> str:
        with self._cluster.worker_stopped(index):
            self._stopping.wait(LEASE_S + 5)
        return f"gpu-{index}"

    def _down_a_while(self, kill: Callable[[], None], start: Callable[[], None], name: str) -> str:
        with self._cluster.lock:
            self._cluster.intended_down.add(name)
            kill()
        self._stopping.wait(SERVICE_DOWN_S)
        with self._cluster.lock:
            start()
            self._cluster.intended_down.discard(name)
        return name

    def _poison(self) -> str:
        asyncio.run_coroutine_threadsafe(self._load.poison(), self._loop).result(timeout=300)
        return "engine"

    def _drop_receiver(self) -> str:
        self._cluster.receiver.stop()
        self._stopping.wait(self._rng.uniform(*RECEIVER_DOWN_S))
        self._cluster.receiver.start()
        return "receiver"


def _done(action: Callable[[int], None], index: int, target: str) -> str:
    action(index)
    return target
