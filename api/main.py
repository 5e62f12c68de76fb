"""Builds the FastAPI app. Nothing else happens here."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from redis.asyncio import Redis as AsyncRedis

from api.auth import Authenticator
from api.batch_follow import BatchFeeds
from api.bodysize import BodySizeLimit
from api.deps import ApiServices, Online
from api.errors import register_error_handlers
from api.grouping import Grouped
from api.idempotency import Idempotency
from api.metrics import (
    ApiMetrics,
    QueueCollector,
    RequestMetrics,
    StuckJobsCollector,
    UsageCollector,
)
from api.ratelimit import RateLimiter
from api.routes import (
    admin,
    batches,
    completions,
    embeddings,
    files,
    health,
    jobs,
    message_batches,
    messages,
    models,
    responses,
    status,
    usage,
    webhooks,
)
from api.stream_reader import StreamReader
from api.submission import Submission
from api.token_follower import TokenFollower
from api.urlcheck import RefuseNulInUrl
from api.waiter import RECHECK_S, JobWaiter
from inferq import __version__
from inferq.app import App
from inferq.settings import Settings
from inferq.store.api_keys import KeyStore
from inferq.store.migrate import check_schema
from inferq.wire import prompts

log = logging.getLogger(__name__)

# Most submissions (or reads) written in one transaction.
MAX_GROUP = 256

# Allocations between the garbage collector's young passes (Python's default is 700). A
# request makes thousands of objects, nearly all freed by their counts as it ends; at the
# default, young passes walked those of the requests in flight several times each
# (bench/RESULTS.md, "The whole stack at a GPU's pace").
YOUNG_PASS_EVERY = 20_000


def build_services(app: App) -> ApiServices:
    """What only the API process has, beside the `App`: connected once per process."""
    settings = app.settings
    prefix = settings.redis_key_prefix
    async_redis = AsyncRedis.from_url(settings.redis_url)
    waiter = JobWaiter(async_redis, key_prefix=prefix, ended_among=app.job_operations.ended_among)
    stream_reader = StreamReader(async_redis, block_ms=int(RECHECK_S * 1000))
    rate_limiter = RateLimiter(
        settings.redis_url,
        key_prefix=prefix,
        default_rpm=settings.rate_limit_rpm,
        default_tpm=settings.rate_limit_tpm,
    )
    submission = Submission(
        catalog=app.catalog,
        webhooks=app.webhook_operations,
        jobs=app.job_operations,
        rate_limiter=rate_limiter,
        submit=Grouped(app.job_operations.submit, max_items=MAX_GROUP),
        waiter=waiter,
    )
    return ApiServices(
        app=app,
        stream_reader=stream_reader,
        feeds=BatchFeeds(output=app.batch_output, batches=app.batch_operations, waiter=waiter),
        authenticator=Authenticator(
            app.keys, enabled=settings.auth_enabled, cache_s=settings.auth_cache_s
        ),
        rate_limiter=rate_limiter,
        online=Online(
            submission=submission,
            idempotency=Idempotency(app.idempotency, ttl_s=settings.idempotency_ttl_s),
            read=Grouped(app.job_operations.get_many, max_items=MAX_GROUP),
            waiter=waiter,
            follower=TokenFollower(stream_reader, key_prefix=prefix, waiter=waiter),
            max_wait_s=settings.max_wait_s,
        ),
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


def _preload_and_freeze() -> None:
    """What a first request would load, loaded; then what startup made, which lives as
    long as the process, kept out of the garbage collector's passes (as `vllm serve`
    does): each full pass walked all of it again, a sixth of the API's CPU under load.
    Young passes are spaced out too (`YOUNG_PASS_EVERY`)."""
    prompts.preload()
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_PASS_EVERY, *gc.get_threshold()[1:])


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_schema(settings.database_url)
        inferq = App(settings)
        services = build_services(inferq)
        _prepare_keys(settings, inferq.keys)
        # Every registered model's tokenizer, before the first request needs it; and for
        # a model registered later, what loading its tokenizer needs.
        inferq.catalog.warm()
        preloading = asyncio.create_task(asyncio.to_thread(_preload_and_freeze))
        app.state.services = services
        metrics.registry.register(QueueCollector(inferq.queues, inferq.workers, inferq.catalog))
        metrics.registry.register(StuckJobsCollector(inferq.stuck_jobs))
        metrics.registry.register(UsageCollector(inferq.usage))
        await services.online.waiter.start()
        await services.stream_reader.start()
        try:
            yield
        finally:
            preloading.cancel()
            await services.stream_reader.stop()
            await services.online.waiter.stop()

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
        # A message batch's requests become its input file: they may be as large as one.
        upload_paths=("/v1/files", "/v1/messages/batches"),
    )
    app.add_middleware(RequestMetrics, metrics=metrics)
    app.include_router(health.router)
    app.include_router(jobs.router)
    app.include_router(completions.router)
    app.include_router(responses.router)
    app.include_router(messages.router)
    app.include_router(message_batches.router)
    app.include_router(embeddings.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(batches.estimates_router)
    app.include_router(models.router)
    app.include_router(status.router)
    app.include_router(webhooks.router)
    app.include_router(usage.router)
    app.include_router(admin.router)
    return app
