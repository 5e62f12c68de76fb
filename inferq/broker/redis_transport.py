"""kombu's Redis transport, with a connection that has been let go failing as a lost
connection rather than as a bug, and one client for a channel's commands.

When its broker goes away, Celery collects the broken connection, which detaches the
transport from its client. Whatever then touches one of that connection's channels (Celery
5.7.0 closes it a second time; a job's late acknowledgement comes after the reconnect)
needs Redis again, and kombu, building a client from the detached transport, raises
AttributeError. Celery takes that for an unrecoverable error and the worker exits: a GPU
worker's engine is then loaded again from scratch (minutes for a large model). The chaos
run saw it on every Redis restart (bench/chaos). Raised as Redis's ConnectionError, it is
what Celery and kombu already handle there: the close is ignored, the acknowledgement is
logged and dropped (the message comes back after its visibility timeout, or, when Redis
lost it, from Postgres at the next maintenance pass; either way a job gets one result:
results are written once), and the worker reconnects.

kombu builds a new Redis client for every publish, and for every message a worker takes
and acknowledges (twice a message): a client costs twice the CPU of the LPUSH it sends
(redis-py fills its tables of response callbacks each time). A client is a handle on the
channel's connection pool and safe to share between threads, so the channel keeps one per
pool and hands it out, until kombu replaces the pool (after a failure).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

TRANSPORT = "inferq.broker.redis_transport:Transport"


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    def _connparams(self, asynchronous: bool = False) -> dict[str, Any]:
        if self.connection.client is None:
            raise RedisConnectionError("this broker connection was closed after a failure")
        params: dict[str, Any] = super()._connparams(asynchronous=asynchronous)
        return params

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client is not None:
            yield client
            return
        shared = getattr(self, "_shared_client", None)
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()
        yield shared


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


def install() -> None:
    """`redis://` and `rediss://` broker URLs take this transport in this process. The
    URLs stay as they are, so what shows them (Celery's log, Flower, which picks its queue
    reader by the URL's scheme) sees Redis."""
    for scheme in ("redis", "rediss"):
        TRANSPORT_ALIASES[scheme] = TRANSPORT
