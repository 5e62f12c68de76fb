"""The composition root: every long-lived object a process needs, built once from settings.

Each process makes one `App` and takes what it uses (`app.job_operations`, `app.jobs`, …);
each piece is built the first time it is asked for, so the GPU worker never loads the API's
model catalog and nothing connects to Redis or Postgres before it is needed. Whatever a
piece depends on comes from the same `App`, so every process wires it the same way."""

from __future__ import annotations

from functools import cached_property

from celery import Celery
from redis import Redis
from redis.exceptions import RedisError
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from inferq.broker.celery_app import JobPublisher, make_celery
from inferq.broker.events import JobEvents
from inferq.broker.queues import QueueMonitor
from inferq.broker.stuck_jobs import StuckJobs
from inferq.broker.worker_registry import WorkerRegistry
from inferq.exceptions import StoreUnavailable
from inferq.operations.batch_estimates import BatchEstimates
from inferq.operations.batch_output import BatchOutput
from inferq.operations.batches import BatchLifecycle, BatchOperations
from inferq.operations.files import FileOperations
from inferq.operations.jobs import JobOperations
from inferq.operations.message_batches import MessageBatches
from inferq.operations.usage import UsageOperations
from inferq.operations.webhooks import WebhookOperations
from inferq.settings import Settings
from inferq.store.api_keys import KeyStore
from inferq.store.batch_work import BatchWorkStore
from inferq.store.batches import BatchStore
from inferq.store.database import make_database, make_sessions
from inferq.store.engine_speeds import SpeedStore
from inferq.store.files import FileStore
from inferq.store.idempotency import IdempotencyStore
from inferq.store.jobs import JobStore
from inferq.store.retention import RetentionStore
from inferq.store.served_models import ModelStore
from inferq.store.usage import UsageStore
from inferq.store.webhooks import WebhookStore
from inferq.wire.model_catalog import ModelCatalog, RequestLimits


class App:
    """One per process. `pool_size`: the database connections it keeps open (each thread
    that talks to Postgres at once needs one); `pre_ping`: see `make_database`;
    `keep_connections`: the job store's threads keep theirs (see `inferq.store.base.Store`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        pool_size: int = 10,
        pre_ping: bool = True,
        keep_connections: bool = False,
    ) -> None:
        self.settings = settings
        self._pool_size = pool_size
        self._pre_ping = pre_ping
        self._keep_connections = keep_connections

    def close(self) -> None:
        """Let go of the database connections (a process that ends need not call it)."""
        if "database" in self.__dict__:
            self.database.dispose()

    # Connections.

    @cached_property
    def database(self) -> Engine:
        return make_database(
            self.settings.database_url, pool_size=self._pool_size, pre_ping=self._pre_ping
        )

    @cached_property
    def sessions(self) -> sessionmaker[Session]:
        return make_sessions(self.database)

    @cached_property
    def redis(self) -> Redis:
        return Redis.from_url(self.settings.redis_url)

    @cached_property
    def celery(self) -> Celery:
        """The Celery app this process publishes with (the housekeeper also consumes)."""
        return make_celery(self.settings)

    # The broker.

    @cached_property
    def publisher(self) -> JobPublisher:
        return JobPublisher.from_settings(self.settings, self.celery)

    @cached_property
    def events(self) -> JobEvents:
        return JobEvents(self.redis, key_prefix=self.settings.redis_key_prefix)

    @cached_property
    def queues(self) -> QueueMonitor:
        return QueueMonitor(self.redis, key_prefix=self.settings.redis_key_prefix)

    @cached_property
    def workers(self) -> WorkerRegistry:
        return WorkerRegistry(self.redis, key_prefix=self.settings.redis_key_prefix)

    @cached_property
    def stuck_jobs(self) -> StuckJobs:
        return StuckJobs(self.redis, key_prefix=self.settings.redis_key_prefix)

    # The stores. Those that end jobs or batches nudge the webhook sender when they do.

    @cached_property
    def jobs(self) -> JobStore:
        return JobStore(
            self.sessions,
            on_webhooks=self.publisher.publish_webhooks,
            keep_connections=self._keep_connections,
        )

    @cached_property
    def batches(self) -> BatchStore:
        return BatchStore(self.sessions, on_webhooks=self.publisher.publish_webhooks)

    @cached_property
    def files(self) -> FileStore:
        return FileStore(self.sessions)

    @cached_property
    def webhooks(self) -> WebhookStore:
        return WebhookStore(self.sessions)

    @cached_property
    def keys(self) -> KeyStore:
        return KeyStore(self.sessions)

    @cached_property
    def idempotency(self) -> IdempotencyStore:
        return IdempotencyStore(self.sessions)

    @cached_property
    def served_models(self) -> ModelStore:
        return ModelStore(self.sessions)

    @cached_property
    def retention(self) -> RetentionStore:
        return RetentionStore(self.sessions)

    @cached_property
    def speeds(self) -> SpeedStore:
        return SpeedStore(self.sessions)

    @cached_property
    def usage(self) -> UsageStore:
        return UsageStore(self.sessions)

    @cached_property
    def usage_operations(self) -> UsageOperations:
        return UsageOperations(usage=self.usage, keys=self.keys)

    @cached_property
    def batch_work(self) -> BatchWorkStore:
        return BatchWorkStore(self.sessions)

    # Operations.

    @cached_property
    def catalog(self) -> ModelCatalog:
        """The models the GPU workers registered, each with its tokenizer and validator."""
        return ModelCatalog(self.served_models, limits=RequestLimits.from_settings(self.settings))

    @cached_property
    def job_operations(self) -> JobOperations:
        return JobOperations(
            store=self.jobs,
            publisher=self.publisher,
            events=self.events,
            queues=self.queues,
            high_water=self.settings.interactive_high_water,
            requeue_after_s=self.settings.requeue_after_s,
        )

    @cached_property
    def batch_output(self) -> BatchOutput:
        return BatchOutput(files=self.files, batches=self.batches)

    @cached_property
    def batch_estimates(self) -> BatchEstimates:
        return BatchEstimates(work=self.batch_work, speeds=self.speeds, models=self.served_models)

    @cached_property
    def batch_operations(self) -> BatchOperations:
        return BatchOperations(
            files=self.files,
            batches=self.batches,
            models=self.catalog,
            publisher=self.publisher,
            events=self.events,
            output=self.batch_output,
            estimates=self.batch_estimates,
            max_lines=self.settings.max_batch_lines,
            requeue_after_s=self.settings.requeue_after_s,
            retention_s=self.settings.job_retention_s,
        )

    @cached_property
    def batch_lifecycle(self) -> BatchLifecycle:
        return BatchLifecycle(
            batches=self.batches,
            publisher=self.publisher,
            events=self.events,
            output=self.batch_output,
        )

    @cached_property
    def file_operations(self) -> FileOperations:
        return FileOperations(
            files=self.files,
            output=self.batch_output,
            max_bytes=self.settings.max_file_bytes,
            retention_s=self.settings.job_retention_s,
        )

    @cached_property
    def message_batches(self) -> MessageBatches:
        return MessageBatches(batches=self.batch_operations, files=self.file_operations)

    @cached_property
    def webhook_operations(self) -> WebhookOperations:
        return WebhookOperations(
            store=self.webhooks,
            publisher=self.publisher,
            allowed_networks=self.settings.webhook_allowed_networks,
            secret_overlap_s=self.settings.webhook_secret_overlap_s,
        )

    def connections(self) -> dict[str, str]:
        """Whether Postgres and Redis answer: "ok", or what is wrong, for each."""
        checks: dict[str, str] = {}
        try:
            self.jobs.ping()
            checks["postgres"] = "ok"
        except StoreUnavailable as exc:
            checks["postgres"] = exc.message
        try:
            self.redis.ping()
            checks["redis"] = "ok"
        except RedisError as exc:
            checks["redis"] = f"unreachable: {exc}"
        return checks
