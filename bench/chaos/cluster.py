"""The deployment the chaos run breaks: a Postgres and a Redis of its own (which it may
kill), two API processes, two GPU workers (vLLM on CPU with the tiny model, each with the
tests' fault hooks: a request with `POISON_SEED` kills its engine core, and SIGUSR1 kills
its result writer's thread), the housekeeper, beat, and a webhook receiver that fails a
share of deliveries. Every process is started from the same entry points as production;
each can be killed and started again in its place.

`supervise` is compose's `restart: unless-stopped`: an inferq process that exits without
a fault taking it down on purpose (`intended_down`) is started again, with its exit code
logged (71: a thread died, 72: stuck past healing, 70: its engine was lost)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.chaos.receiver import Receiver
from bench.stack import demo_model
from inferq.broker.celery_app import make_celery
from inferq.settings import Settings
from inferq.store.migrate import upgrade
from tests.helpers.processes import (
    INFERQ,
    ServiceProcess,
    free_port,
    http_ok,
    log_contains,
    start_worker,
)
from tests.helpers.servers import PostgresServer, RedisServer

MODEL_NAME = "tiny"
ADMIN_KEY = "iq_chaos_" + "0" * 32
# A request with this seed kills the engine core it enters (tests/helpers/faulty_worker.py).
POISON_SEED = 666
LEASE_S = 10
MAINTENANCE_INTERVAL_S = 2
# A queued job whose message was lost (Redis restarted empty) is published again after this.
REQUEUE_AFTER_S = 60
# Short enough that a stuck process heals within the run; at least two maintenance
# intervals, or beat would count as stuck between two passes.
STALL_S = 30
REDIS_KEY_PREFIX = "chaos:"
# Celery's node names, for its remote control.
HOUSEKEEPER_NODE = "service@chaos"

log = logging.getLogger(__name__)


def worker_node(index: int) -> str:
    return f"gpu-{index}@test"  # as `start_worker` names it


@dataclass(frozen=True)
class Exit:
    """A process that exited on its own, and was started again."""

    name: str
    code: int | None


class Cluster:
    """The processes, by role; `restart_*` and `kill_*` are what the faults do."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        pg_dir = workdir / "postgres"
        pg_dir.mkdir(exist_ok=True)
        self.postgres = PostgresServer(pg_dir)
        self.redis = RedisServer(workdir)
        self.receiver = Receiver()
        self.api_ports = [free_port(), free_port()]
        self.apis: list[ServiceProcess | None] = [None, None]
        self.workers: list[ServiceProcess | None] = [None, None]
        self.housekeeper: ServiceProcess | None = None
        self.beat: ServiceProcess | None = None
        self.env: dict[str, str] = {}
        # Taken down on purpose (a fault), not to be started again by `supervise`.
        self.intended_down: set[str] = set()
        # Processes may be restarted from the fault thread and the final check at once.
        self.lock = threading.RLock()

    @property
    def database_url(self) -> str:
        return self.postgres.url("inferq")

    def start(self) -> None:
        self.postgres.start()
        self.postgres.create_database("inferq")
        upgrade(self.database_url)
        self.redis.start()
        self.receiver.start()
        self.env = {
            "INFERQ_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
            "INFERQ_AUTH_CACHE_S": "0",
            "INFERQ_RATE_LIMIT_RPM": "0",
            "INFERQ_RATE_LIMIT_TPM": "0",
            "INFERQ_DATABASE_URL": self.database_url,
            "INFERQ_REDIS_URL": self.redis.url,
            "INFERQ_REDIS_KEY_PREFIX": REDIS_KEY_PREFIX,
            "INFERQ_MODEL": str(demo_model()),
            "INFERQ_SERVED_MODEL_NAME": MODEL_NAME,
            "INFERQ_ENFORCE_EAGER": "true",
            "INFERQ_DTYPE": "float32",
            "INFERQ_MAX_NUM_SEQS": "16",
            "INFERQ_MAX_BATCH_SIZE": "8",
            "INFERQ_LEASE_S": str(LEASE_S),
            "INFERQ_MAINTENANCE_INTERVAL_S": str(MAINTENANCE_INTERVAL_S),
            "INFERQ_REQUEUE_AFTER_S": str(REQUEUE_AFTER_S),
            "INFERQ_STALL_S": str(STALL_S),
            "INFERQ_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1/32",
            # Retries outlast any outage the faults make (about 8 minutes in all).
            "INFERQ_WEBHOOK_RETRY_SCHEDULE_S": "1,2,4,8,15,30,60,60,60,60,60,60",
            "INFERQ_WEBHOOK_TIMEOUT_S": "5",
            "INFERQ_LOG_LEVEL": "INFO",
            "VLLM_LOGGING_LEVEL": "WARNING",
            "TOKENIZERS_PARALLELISM": "false",
            # vLLM on a CPU pins each engine to the same core by default: two workers on
            # one host would share it, and an engine restarting beside a busy one waited
            # minutes for it. Unpinned, one OpenMP thread each (as the tests run them).
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "OMP_NUM_THREADS": "1",
        }
        for index in range(len(self.api_ports)):
            self.start_api(index)
        for index in range(len(self.workers)):
            self.start_worker(index)
        self.start_housekeeper()
        self.start_beat()

    def api_urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.api_ports]

    def start_api(self, index: int) -> None:
        port = self.api_ports[index]
        api = ServiceProcess(
            f"api-{index}",
            [*INFERQ, "api"],
            env={**os.environ, **self.env, "INFERQ_API_PORT": str(port)},
            log_dir=self.logs,
        )
        # Postgres may be down just now: the API may need a few tries to come up.
        api.wait_until(http_ok(f"http://127.0.0.1:{port}/healthz"), timeout_s=120, what="up")
        self.apis[index] = api

    def start_worker(self, index: int) -> None:
        worker = start_worker(
            env={**self.env},
            log_dir=self.logs,
            name=f"gpu-{index}",
            wait=False,
            kill_engine_seed=POISON_SEED,
            die_on_sigusr1=True,
        )
        self.workers[index] = worker

    def start_housekeeper(self) -> None:
        self.housekeeper = ServiceProcess(
            "housekeeper",
            [*INFERQ, "webhooks", "--name", HOUSEKEEPER_NODE],
            env=self.env,
            log_dir=self.logs,
        )

    def start_beat(self) -> None:
        self.beat = ServiceProcess("beat", [*INFERQ, "beat"], env=self.env, log_dir=self.logs)

    def wait_ready(self, timeout_s: float = 300) -> None:
        """Every worker consuming, the housekeeper too."""
        for worker in self.workers:
            assert worker is not None
            worker.wait_until(log_contains(worker, " ready."), timeout_s=timeout_s, what="ready")
        assert self.housekeeper is not None
        self.housekeeper.wait_until(
            log_contains(self.housekeeper, " ready."), timeout_s=timeout_s, what="ready"
        )

    def stop(self) -> None:
        with self.lock:
            for process in [*self.apis, *self.workers, self.housekeeper, self.beat]:
                if process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        process.discard()
            self.receiver.stop()
            self.redis.kill()
            with contextlib.suppress(subprocess.CalledProcessError):
                self.postgres.stop()

    # What the faults do.

    def kill_worker(self, index: int) -> None:
        with self.lock:
            worker = self.workers[index]
            assert worker is not None
            worker.kill_group()
            self.start_worker(index)

    @contextlib.contextmanager
    def worker_stopped(self, index: int) -> Iterator[None]:
        worker = self.workers[index]
        assert worker is not None
        worker.signal_group(signal.SIGSTOP)
        try:
            yield
        finally:
            worker.signal_group(signal.SIGCONT)

    def kill_writer_thread(self, index: int) -> ServiceProcess | None:
        """SIGUSR1 to the worker itself (not its engine core, which it would end): its
        result writer's thread dies at its next announcement; the worker, to wait on
        (None if it had exited already)."""
        with self.lock:
            worker = self.workers[index]
            assert worker is not None
            if not worker.alive():
                return None
            worker.signal(signal.SIGUSR1)
            return worker

    def busy_workers(self) -> list[int]:
        """The GPU workers that hold running jobs now (by Postgres; none if it is away)."""
        dsn = self.database_url.replace("+psycopg", "")
        try:
            with psycopg.connect(dsn, connect_timeout=5) as conn:
                rows = conn.execute("SELECT DISTINCT worker FROM jobs WHERE status = 'running'")
                nodes = {row[0] for row in rows}
        except psycopg.Error:
            return []
        return [i for i in range(len(self.workers)) if worker_node(i) in nodes]

    def cancel_consumers(self, node: str, queues: Sequence[str]) -> list[Any]:
        """Celery's own remote control, as an operator's `celery control cancel_consumer`:
        the node's answers, one a queue (an empty list where it did not answer)."""
        settings = Settings(redis_url=self.redis.url, redis_key_prefix=REDIS_KEY_PREFIX)
        control = make_celery(settings)
        try:
            return [
                control.control.cancel_consumer(queue, destination=[node], reply=True)
                for queue in queues
            ]
        finally:
            control.close()

    def kill_api(self, index: int) -> None:
        with self.lock:
            api = self.apis[index]
            assert api is not None
            api.kill_group()
            self.start_api(index)

    def restart_redis(self) -> None:
        with self.lock:
            self.redis.kill()
            self.redis.start()

    def restart_postgres(self) -> None:
        """An immediate shutdown (as a crash: no checkpoint), then a start."""
        with self.lock:
            self.postgres.stop(mode="immediate")
            self.postgres.start()

    def kill_housekeeper(self) -> None:
        with self.lock:
            assert self.housekeeper is not None
            self.housekeeper.kill_group()

    def kill_beat(self) -> None:
        with self.lock:
            assert self.beat is not None
            self.beat.kill_group()

    def supervise(self) -> list[Exit]:
        """Start again whatever exited that no fault took down, as compose's `restart:
        unless-stopped` would; those started, with the code each exited with."""
        exits = []
        with self.lock:
            for process, start in self._roles():
                if process is None or process.alive() or process.name in self.intended_down:
                    continue
                code = process.process.returncode
                log.warning("%s exited on its own (%s); starting it again", process.name, code)
                # What it started dies with it (a GPU worker's engine core lives on, else).
                process.discard()
                exits.append(Exit(process.name, code))
                start()
        return exits

    def _roles(self) -> list[tuple[ServiceProcess | None, Callable[[], None]]]:
        """Each process, and how to start it again in its place."""
        roles: list[tuple[ServiceProcess | None, Callable[[], None]]] = []
        for index, api in enumerate(self.apis):
            roles.append((api, lambda i=index: self.start_api(i)))
        for index, worker in enumerate(self.workers):
            roles.append((worker, lambda i=index: self.start_worker(i)))
        roles += [(self.housekeeper, self.start_housekeeper), (self.beat, self.start_beat)]
        return roles

    def healthy(self) -> bool:
        """Every API answers."""
        return all(
            httpx.get(url + "/healthz", timeout=2).status_code == 200 for url in self.api_urls()
        )
