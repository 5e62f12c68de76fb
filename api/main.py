"""Builds the FastAPI app. Nothing else happens here."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from api.auth import Authenticator
from api.bodysize import BodySizeLimit
from api.deps import Services
from api.errors import register_error_handlers
from api.grouping import Grouped
from api.metrics import ApiMetrics, QueueCollector, RequestMetrics
from api.ratelimit import RateLimiter
from api.routes import (
    batches,
    completions,
    embeddings,
    files,
    health,
    jobs,
    models,
    status,
    webhooks,
)
from api.token_follower import TokenFollower
from api.urlcheck import RefuseNulInUrl
from api.waiter import JobWaiter
from inferq import __version__
from inferq.broker.celery_app import JobPublisher
from inferq.broker.events import JobEvents
from inferq.broker.queues import QueueMonitor
from inferq.broker.worker_registry import WorkerRegistry
from inferq.operations.batches import BatchOperations
from inferq.operations.jobs import JobOperations
from inferq.settings import Settings
from inferq.store.api_keys import KeyStore
from inferq.store.batches import BatchStore
from inferq.store.engine import make_engine, make_sessions
from inferq.store.files import FileStore
from inferq.store.idempotency import IdempotencyStore
from inferq.store.jobs import JobStore
from inferq.store.migrate import check_schema
from inferq.store.served_models import ModelStore
from inferq.store.webhooks import WebhookStore
from inferq.wire.model_catalog import ModelCatalog, RequestLimits

log = logging.getLogger(__name__)

# Most submissions (or reads) written in one transaction.
MAX_GROUP = 256


def build_services(settings: Settings) -> Services:
    """Connect to Postgres and Redis: once per process. Models (and their tokenizers) are
    learned from what the GPU workers registered, when first asked for."""
    redis = Redis.from_url(settings.redis_url)
    sessions = make_sessions(make_engine(settings.database_url))
    keys = KeyStore(sessions)
    prefix = settings.redis_key_prefix
    models = ModelCatalog(ModelStore(sessions), limits=RequestLimits.from_settings(settings))
    publisher = JobPublisher.from_settings(settings)
    events = JobEvents(redis, key_prefix=prefix)
    files = FileStore(sessions)
    store = JobStore(sessions, on_webhooks=publisher.publish_webhooks)
    queues = QueueMonitor(redis, key_prefix=prefix)
    job_ops = JobOperations(
        store=store,
        publisher=publisher,
        events=events,
        queues=queues,
        high_water=settings.interactive_high_water,
        requeue_after_s=settings.requeue_after_s,
    )
    async_redis = AsyncRedis.from_url(settings.redis_url)
    waiter = JobWaiter(async_redis, key_prefix=prefix)
    return Services(
        settings=settings,
        store=store,
        publisher=publisher,
        models=models,
        events=events,
        waiter=waiter,
        follower=TokenFollower(async_redis, key_prefix=prefix, waiter=waiter),
        redis=redis,
        keys=keys,
        authenticator=Authenticator(
            keys, enabled=settings.auth_enabled, cache_s=settings.auth_cache_s
        ),
        rate_limiter=RateLimiter(
            settings.redis_url,
            key_prefix=prefix,
            default_rpm=settings.rate_limit_rpm,
            default_tpm=settings.rate_limit_tpm,
        ),
        queues=queues,
        idempotency=IdempotencyStore(sessions),
        workers=WorkerRegistry(redis, key_prefix=prefix),
        files=files,
        webhooks=WebhookStore(sessions),
        batch_ops=BatchOperations(
            files=files,
            batches=BatchStore(sessions, on_webhooks=publisher.publish_webhooks),
            models=models,
            publisher=publisher,
            events=events,
            max_lines=settings.max_batch_lines,
            requeue_after_s=settings.requeue_after_s,
        ),
        job_ops=job_ops,
        submit=Grouped(job_ops.submit, max_items=MAX_GROUP),
        read=Grouped(job_ops.get_many, max_items=MAX_GROUP),
    )


def _prepare_keys(settings: Settings, keys: KeyStore) -> None:
    if not settings.auth_enabled:
        log.warning("authentication is OFF (development): every request acts as an admin")
        return
    if settings.bootstrap_admin_key is not None:
        keys.ensure(settings.bootstrap_admin_key.get_secret_value(), name="bootstrap", admin=True)
    elif keys.count_active() == 0:
        log.warning(
            "no API keys exist yet, so every /v1 request is refused. Create one with "
            "`inferq keys create --name admin --admin`, or set INFERQ_BOOTSTRAP_ADMIN_KEY "
            "(e.g. from `openssl rand -hex 32`) and restart."
        )


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_schema(settings.database_url)
        services = build_services(settings)
        _prepare_keys(settings, services.keys)
        # Every registered model's tokenizer, before the first request needs it.
        services.models.warm()
        app.state.services = services
        metrics.registry.register(
            QueueCollector(services.queues, services.workers, services.models)
        )
        await services.waiter.start()
        try:
            yield
        finally:
            await services.waiter.stop()

    app = FastAPI(
        title="inferq",
        version=__version__,
        summary="Queue-based batch inference for open-weight LLMs on vLLM.",
        lifespan=lifespan,
    )
    metrics = ApiMetrics(CollectorRegistry())
    app.state.metrics = metrics
    register_error_handlers(app)
    app.add_middleware(RefuseNulInUrl)
    app.add_middleware(
        BodySizeLimit,
        limit_bytes=settings.max_request_bytes,
        # A multipart upload carries a little more than the file itself.
        upload_limit_bytes=settings.max_file_bytes + 64 * 1024,
        upload_paths=("/v1/files",),
    )
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(completions.router)
    app.include_router(embeddings.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(models.router)
    app.include_router(status.router)
    app.include_router(webhooks.router)
    return app
