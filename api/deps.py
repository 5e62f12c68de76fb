"""What routes depend on, as `Annotated` aliases."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from redis import Redis

from api.auth import Authenticator
from api.ratelimit import RateLimiter
from api.waiter import JobWaiter
from inferq.batch_ops import BatchOperations
from inferq.celery_app import JobPublisher
from inferq.db.files import FileStore
from inferq.db.idempotency import IdempotencyStore
from inferq.db.jobs import JobStore
from inferq.db.keys import KeyStore
from inferq.db.webhooks import WebhookStore
from inferq.events import JobEvents
from inferq.keys import Principal
from inferq.queues import QueueMonitor
from inferq.requests import JobValidator
from inferq.settings import Settings
from inferq.workers import WorkerRegistry


@dataclass
class Services:
    """Everything long-lived the API uses, built once at start-up."""

    settings: Settings
    store: JobStore
    publisher: JobPublisher
    validator: JobValidator
    events: JobEvents
    waiter: JobWaiter
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


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


_bearer = HTTPBearer(auto_error=False, description="An inferq API key.")


def current_principal(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller, authenticated and counted against its requests-per-minute limit."""
    principal = services.authenticator.principal(
        credentials.credentials if credentials is not None else None
    )
    services.rate_limiter.request(principal)
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]
