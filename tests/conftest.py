"""Session fixtures: the tiny model, a migrated database template, key-space isolation,
and the running stack (API + GPU worker as real processes on real Redis and Postgres).

The suite runs on three pytest-xdist workers (`scripts/test`). Each worker has its own
session fixtures (database template, stack); a fixture that starts engines for a module or
package keeps its tests on one worker with an `xdist_group` mark, so it starts once. The
heaviest tests go first, so the workers end together rather than one waiting on the
other's last fault test.
"""

from __future__ import annotations

import fcntl
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from redis import Redis
from sqlalchemy.orm import Session, sessionmaker

from cli.demo_model import CPU_DTYPE, TINY, build_demo_model
from inferq.store.api_keys import KeyStore
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore
from inferq.wire.prompts import PromptRenderer
from tests.helpers.broker import Broker
from tests.helpers.databases import cloned_database, migrated_template
from tests.helpers.deployment import Deployment
from tests.helpers.processes import (
    ENGINE_CORE_APART,
    ENGINE_CORE_HERE,
    INFERQ,
    ServiceProcess,
    free_port,
    log_contains,
    start_api,
    start_worker,
    wait_worker_ready,
)
from tests.helpers.servers import RedisServer, redis_server

# vLLM on a CPU pins each engine's worker process to one core by default, the same core for
# every engine (seen here: core 0 of 2, the other "reserved"), so the engines of the two test
# processes and of a deployment's several workers would all share it. Unpinned, one OpenMP
# thread each, the OS spreads them.
# Set here, before any engine or inferq process starts: they inherit it.
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
os.environ.setdefault("OMP_NUM_THREADS", "1")

REDIS_URL = "redis://127.0.0.1:6379/0"
MODEL_NAME = "tiny"


# Fixtures that start the real engine: a test using any of them is an `engine` test.
ENGINE_FIXTURES = frozenset({"stack", "models_stack", "deployment"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)
    # Stable, and constant within a file: a module's tests stay together.
    items.sort(key=_heaviness)


def _heaviness(item: pytest.Item) -> int:
    """0 first: tests sharing engines of their own, then fault tests (a deployment each,
    a minute or more), then the rest of the integration tests, then unit tests."""
    if item.get_closest_marker("xdist_group"):
        return 0
    parts = item.path.parts
    if "fault" in parts:
        return 1
    return 2 if "integration" in parts else 3


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny Llama (random weights, trained tokenizer), built offline once and cached."""
    cache = Path(os.environ.get("INFERQ_TEST_CACHE", Path.home() / ".cache" / "inferq-tests"))
    cache.mkdir(parents=True, exist_ok=True)
    # Both xdist workers ask for it at once: one builds, the other waits and reuses it.
    with (cache / "tiny.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_demo_model(cache / "tiny", TINY)


@pytest.fixture(scope="session")
def renderer(tiny_model: Path) -> PromptRenderer:
    return PromptRenderer.load(str(tiny_model), max_model_len=None)


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    with migrated_template() as name:
        yield name


@pytest.fixture
def database_url(pg_template: str) -> Iterator[str]:
    """A database of this test's own, at the head revision."""
    with cloned_database(pg_template) as url:
        yield url


def new_key_prefix() -> str:
    return f"inferq-test-{secrets.token_hex(4)}:"


def delete_keys(prefix: str, redis_url: str = REDIS_URL) -> None:
    redis = Redis.from_url(redis_url)
    keys = list(redis.scan_iter(match=f"{prefix}*", count=1000))
    if keys:
        redis.delete(*keys)
    redis.close()


@pytest.fixture
def key_prefix() -> Iterator[str]:
    """A Redis key space of this test's own."""
    prefix = new_key_prefix()
    yield prefix
    delete_keys(prefix)


ADMIN_KEY = "iq_test-admin-" + secrets.token_hex(16)


def service_env(*, model: Path, database_url: str, key_prefix: str, **extra: str) -> dict[str, str]:
    """Environment for inferq processes under test: the tiny model, small and quick."""
    env = {
        "INFERQ_BOOTSTRAP_ADMIN_KEY": ADMIN_KEY,
        # Keys are looked up on every request, so a revoked key fails at once.
        "INFERQ_AUTH_CACHE_S": "0",
        # No default rate limits: the tests that need limits give their keys their own.
        "INFERQ_RATE_LIMIT_RPM": "0",
        "INFERQ_RATE_LIMIT_TPM": "0",
        "INFERQ_DATABASE_URL": database_url,
        "INFERQ_REDIS_URL": REDIS_URL,
        "INFERQ_REDIS_KEY_PREFIX": key_prefix,
        "INFERQ_MODEL": str(model),
        "INFERQ_SERVED_MODEL_NAME": MODEL_NAME,
        "INFERQ_ENFORCE_EAGER": "true",
        "INFERQ_DTYPE": CPU_DTYPE,
        "INFERQ_MAX_NUM_SEQS": "16",
        "INFERQ_MAX_BATCH_SIZE": "8",
        "INFERQ_LEASE_S": "15",
        "INFERQ_LOG_LEVEL": "INFO",
        "VLLM_LOGGING_LEVEL": "WARNING",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
        **ENGINE_CORE_HERE,
    }
    env.update(extra)
    return env


@dataclass
class Stack:
    """A running inferq: API and GPU worker processes over their own database and keys."""

    url: str
    env: dict[str, str]
    store: JobStore
    keys: KeyStore
    # Sessions on the stack's database, for tests that read its rows directly.
    sessions: sessionmaker[Session]
    api: ServiceProcess
    worker: ServiceProcess
    service: ServiceProcess

    def headers(self, key: str | None = ADMIN_KEY) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"} if key else {}

    def async_client(self, key: str | None = ADMIN_KEY, **kwargs: object) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, timeout=60, headers=self.headers(key), **kwargs)  # type: ignore[arg-type]

    def client(self, key: str | None = ADMIN_KEY, **kwargs: object) -> httpx.Client:
        """An HTTP client for the API, with `key` (the admin's by default; None for none)."""
        return httpx.Client(base_url=self.url, timeout=120, headers=self.headers(key), **kwargs)  # type: ignore[arg-type]

    def new_key(self, *, tenant: str | None = None, **kwargs: object) -> str:
        """A fresh API key (of a fresh tenant unless `tenant` is given); returns the secret."""
        name = f"test-{secrets.token_hex(3)}"
        return self.keys.create(name=name, tenant=tenant, **kwargs)[1]  # type: ignore[arg-type]

    def tenant_of(self, secret: str) -> str:
        key = self.keys.find(secret)
        assert key is not None
        return key.tenant


@pytest.fixture(scope="session")
def stack(
    tiny_model: Path, pg_template: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("stack-logs")
    prefix = new_key_prefix()
    with cloned_database(pg_template) as database_url:
        env = service_env(
            model=tiny_model,
            database_url=database_url,
            key_prefix=prefix,
            INFERQ_MAINTENANCE_INTERVAL_S="2",
            # Small file limits, so the tests can go past them cheaply.
            INFERQ_MAX_BATCH_LINES="5000",
            INFERQ_MAX_FILE_BYTES=str(8 * 1024 * 1024),
            # The whole engine yields the cores to the pipeline (by default its core alone
            # does): its processes apart, as on a GPU, so that they can.
            INFERQ_ENGINE_NICE="19",
            **ENGINE_CORE_APART,
            **WEBHOOK_SETTINGS,
        )
        port = free_port()
        # Each process is killed at the end, or as soon as another fails to start.
        with ExitStack() as processes:
            processes.callback(delete_keys, prefix)
            api = start_api(env=env, port=port, log_dir=logs)
            processes.callback(api.discard)
            worker = start_worker(env=env, log_dir=logs, wait=False)
            processes.callback(worker.discard)
            service = ServiceProcess(
                "service", [*INFERQ, "webhooks", "--name", "service@test"], env=env, log_dir=logs
            )
            processes.callback(service.discard)
            beat = ServiceProcess("beat", [*INFERQ, "beat"], env=env, log_dir=logs)
            processes.callback(beat.discard)
            wait_worker_ready(worker)
            service.wait_until(log_contains(service, " ready."), timeout_s=60, what="consuming")
            engine = make_database(database_url, pool_size=2)
            processes.callback(engine.dispose)
            sessions = make_sessions(engine)
            yield Stack(
                url=f"http://127.0.0.1:{port}",
                env=env,
                store=JobStore(sessions),
                keys=KeyStore(sessions),
                sessions=sessions,
                api=api,
                worker=worker,
                service=service,
            )


@pytest.fixture
def broker(stack: Stack) -> Iterator[Broker]:
    """What the stack's Redis shows: GPU messages not yet done with, maintenance passes."""
    made = Broker.of(stack.env)
    yield made
    made.close()


# Short leases and frequent maintenance, so a lost worker's jobs come back in seconds.
FAULT_SETTINGS = {
    "INFERQ_LEASE_S": "4",
    "INFERQ_MAINTENANCE_INTERVAL_S": "1",
}
# Webhooks to the tests' receiver on 127.0.0.1 (and nowhere else private), retried
# within seconds, with a short timeout.
WEBHOOK_SETTINGS = {
    "INFERQ_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.1/32",
    "INFERQ_WEBHOOK_RETRY_SCHEDULE_S": "0,1,1,1,1",
    "INFERQ_WEBHOOK_TIMEOUT_S": "2",
}

DeploymentFactory = Callable[..., Deployment]


@pytest.fixture
def deployment(tiny_model: Path, pg_template: str, tmp_path: Path) -> Iterator[DeploymentFactory]:
    """Builds a started deployment; `database_url`/`redis_url` point it at own servers,
    `registered=False` starts it with no model known (as a fresh one)."""
    with ExitStack() as cleanup:

        def build(
            *,
            database_url: str | None = None,
            redis_url: str | None = None,
            registered: bool = True,
            **extra: str,
        ) -> Deployment:
            url = database_url or cleanup.enter_context(cloned_database(pg_template))
            prefix = new_key_prefix()
            env = service_env(
                model=tiny_model,
                database_url=url,
                key_prefix=prefix,
                **{**FAULT_SETTINGS, **WEBHOOK_SETTINGS, **extra},
            )
            if redis_url is not None:
                env["INFERQ_REDIS_URL"] = redis_url
            else:
                cleanup.callback(delete_keys, prefix)
            made = Deployment(env=env, log_dir=tmp_path, admin_key=ADMIN_KEY)
            cleanup.callback(made.stop)
            return made.start(registered=registered)

        yield build


@pytest.fixture
def own_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis server of this test's own, to kill and start again."""
    with redis_server(tmp_path) as server:
        yield server


@pytest.fixture
def own_redis(own_redis_server: RedisServer) -> str:
    """The URL of a Redis server of this test's own (request it before `deployment`)."""
    return own_redis_server.url


@pytest.fixture
def own_postgres() -> Iterator[object]:
    """A PostgreSQL server of this test's own, with a migrated `inferq` database."""
    from inferq.store.migrate import upgrade
    from tests.helpers.servers import postgres_server

    with postgres_server() as server:
        server.create_database("inferq")
        upgrade(server.url("inferq"))
        yield server
