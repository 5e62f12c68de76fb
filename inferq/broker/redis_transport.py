"""kombu's Redis transport, with a connection that has been let go failing as a lost
connection rather than as a bug, and one client for a channel's commands.

After a broker failure Celery detaches the broken connection from its transport; a
channel of it touched later (a second close, a late acknowledgement) raises Redis's
ConnectionError here, which Celery and kombu handle by reconnecting, where kombu's
AttributeError would end the worker (and a GPU worker's engine would load again). The
dropped acknowledgement costs nothing: the message comes back, and results are written
once. A channel keeps one Redis client per connection pool for its commands, where kombu
builds one per publish and acknowledgement; a new pool (after a failure) gets a new one."""

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
