"""What routes depend on, as narrow `Annotated` aliases: each route takes the one or two
objects it uses (the operations on its resource, mostly), never the whole process."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, TypeVar

from fastapi import Depends, Request
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from api.auth import Authenticator
from api.batch_follow import BatchFeeds
from api.grouping import Grouped
from api.idempotency import Idempotency
from api.ratelimit import RateLimiter
from api.stream_reader import StreamReader
from api.submission import Submission
from api.token_follower import TokenFollower
from api.waiter import JobWaiter
from inferq.app import App
from inferq.broker.queues import QueueMonitor
from inferq.broker.worker_registry import WorkerRegistry
from inferq.constants import API_KEY_HEADER
from inferq.domain.api_keys import Principal
from inferq.domain.jobs import Job
from inferq.operations.batch_output import BatchOutput
from inferq.operations.batches import BatchOperations
from inferq.operations.files import FileOperations
from inferq.operations.jobs import JobOperations
from inferq.operations.message_batches import MessageBatches
from inferq.operations.usage import UsageOperations
from inferq.operations.webhooks import WebhookOperations
from inferq.wire.model_catalog import ModelCatalog

T = TypeVar("T")

# A job read by id and scope, grouped with concurrent reads (api/grouping.py).
Reads = Grouped[tuple[str, str | None], Job]


@dataclass(frozen=True, kw_only=True)
class Online:
    """What a route that submits a single job, or reads one, and answers when it ends
    uses, in one dependency: FastAPI solves each of a request's dependencies apart, at a
    cost in CPU each, and these are the API's busiest routes (bench/RESULTS.md)."""

    submission: Submission
    idempotency: Idempotency
    read: Reads
    waiter: JobWaiter
    follower: TokenFollower
    # The longest a request may wait for its job (`ApiSettings.max_wait_s`).
    max_wait_s: float


@dataclass(frozen=True, kw_only=True)
class ApiServices:
    """The API process: its `App` and what only the API has, built once at start-up."""

    app: App
    # Every followed token stream, in one read (api/stream_reader.py).
    stream_reader: StreamReader
    # Followers of batches' output, one reader a batch (api/batch_follow.py).
    feeds: BatchFeeds
    authenticator: Authenticator
    rate_limiter: RateLimiter
    # The submission, idempotency, waiter, token follower and grouped reads (concurrent
    # reads, each group in one transaction: api/grouping.py), which other routes take one
    # at a time.
    online: Online


def _services(request: Request) -> ApiServices:
    services: ApiServices = request.app.state.services
    return services


def _taken(pick: Callable[[ApiServices], T]) -> Callable[[Request], Awaitable[T]]:
    """A dependency handing a route `pick(services)`."""

    # async: FastAPI runs a plain `def` dependency in a worker thread.
    async def dependency(request: Request) -> T:
        return pick(_services(request))

    return dependency


# The API's own settings group (limits, waits); the rest is its operations' business.
JobOpsDep = Annotated[JobOperations, Depends(_taken(lambda s: s.app.job_operations))]
BatchOpsDep = Annotated[BatchOperations, Depends(_taken(lambda s: s.app.batch_operations))]
BatchOutputDep = Annotated[BatchOutput, Depends(_taken(lambda s: s.app.batch_output))]
MessageBatchesDep = Annotated[MessageBatches, Depends(_taken(lambda s: s.app.message_batches))]
FileOpsDep = Annotated[FileOperations, Depends(_taken(lambda s: s.app.file_operations))]
WebhookOpsDep = Annotated[WebhookOperations, Depends(_taken(lambda s: s.app.webhook_operations))]
UsageOpsDep = Annotated[UsageOperations, Depends(_taken(lambda s: s.app.usage_operations))]
CatalogDep = Annotated[ModelCatalog, Depends(_taken(lambda s: s.app.catalog))]
QueuesDep = Annotated[QueueMonitor, Depends(_taken(lambda s: s.app.queues))]
WorkersDep = Annotated[WorkerRegistry, Depends(_taken(lambda s: s.app.workers))]
IdempotencyDep = Annotated[Idempotency, Depends(_taken(lambda s: s.online.idempotency))]
SubmissionDep = Annotated[Submission, Depends(_taken(lambda s: s.online.submission))]
FollowerDep = Annotated[TokenFollower, Depends(_taken(lambda s: s.online.follower))]
FeedsDep = Annotated[BatchFeeds, Depends(_taken(lambda s: s.feeds))]
ReadDep = Annotated[Reads, Depends(_taken(lambda s: s.online.read))]
AppDep = Annotated[App, Depends(_taken(lambda s: s.app))]
OnlineDep = Annotated[Online, Depends(_taken(lambda s: s.online))]


_bearer = HTTPBearer(auto_error=False, description="An inferq API key.")
# The header Anthropic's clients send the key in: the same keys, either way.
_api_key = APIKeyHeader(
    name=API_KEY_HEADER, auto_error=False, description="An inferq API key (Anthropic's header)."
)


async def current_principal(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Principal:
    """The caller, authenticated and counted against its requests-per-minute limit."""
    services = _services(request)
    secret = credentials.credentials if credentials is not None else api_key
    # A known key is answered from memory, on the event loop; only a lookup takes a thread.
    principal = services.authenticator.cached(secret)
    if principal is None:
        principal = await run_in_threadpool(services.authenticator.principal, secret)
    await services.rate_limiter.request(principal)
    return principal


PrincipalDep = Annotated[Principal, Depends(current_principal)]
