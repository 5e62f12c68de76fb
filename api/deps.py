"""What routes depend on, as `Annotated` aliases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis
from starlette.concurrency import run_in_threadpool

from api.auth import Authenticator
from api.grouping import Grouped
from api.ratelimit import RateLimiter
from api.token_follower import TokenFollower
from api.waiter import JobWaiter
from inferq.broker.celery_app import JobPublisher
from inferq.broker.events import JobEvents
from inferq.broker.queues import QueueMonitor
from inferq.broker.worker_registry import WorkerRegistry
from inferq.domain.api_keys import Principal
from inferq.domain.jobs import Job
from inferq.operations.batches import BatchOperations
from inferq.operations.jobs import JobOperations
from inferq.settings import Settings
from inferq.store.api_keys import KeyStore
from inferq.store.files import FileStore
from inferq.store.idempotency import IdempotencyStore
from inferq.store.jobs import JobStore, NewJob
from inferq.store.webhooks import WebhookStore
from inferq.wire.model_catalog import ModelCatalog


@dataclass
class Services:
    """Everything long-lived the API uses, built once at start-up."""

    settings: Settings
    store: JobStore
    publisher: JobPublisher
    # The models workers registered, each with its tokenizer and validator.
    models: ModelCatalog
    events: JobEvents
    waiter: JobWaiter
    follower: TokenFollower
    redis: Redis
    keys: KeyStore
    authenticator: Authenticator
    rate_limiter: RateLimiter
    queues: QueueMonitor
    idempotency: IdempotencyStore
    workers: WorkerRegistry
    files: FileStore
    webhooks: WebhookStore
    batch_ops: BatchOperations
    job_ops: JobOperations
    # Concurrent submissions and reads, each group in one transaction (api/grouping.py).
    submit: Grouped[NewJob, Job]
    read: Grouped[tuple[str, str | None], Job]


async def get_services(request: Request) -> Services:
    # async: FastAPI runs a plain `def` dependency in a worker thread.
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


_bearer = HTTPBearer(auto_error=False, description="An inferq API key.")


async def current_principal(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller, authenticated and counted against its requests-per-minute limit."""
    secret = credentials.credentials if credentials is not None else None
    # A known key is answered from memory, on the event loop; only a lookup takes a thread.
    principal = services.authenticator.cached(secret)
    if principal is None:
        principal = await run_in_threadpool(services.authenticator.principal, secret)
    await services.rate_limiter.request(principal)
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]
