"""Listens for cancellations so a running job is aborted in the engine at once."""

from __future__ import annotations

import logging
import threading

from redis import Redis
from redis.exceptions import RedisError

from inferq.events import cancel_channel, decode_ids
from worker.runtime import GpuRuntime

log = logging.getLogger(__name__)


class CancelListener:
    """A thread subscribed to the cancel channel. Missed messages are caught later by
    lease renewal, which drops jobs this worker no longer holds."""

    def __init__(self, redis: Redis, *, key_prefix: str, runtime: GpuRuntime) -> None:
        self._redis = redis
        self._channel = cancel_channel(key_prefix)
        self._runtime = runtime
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cancellations", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(2)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except RedisError as exc:
                log.warning("cancel listener lost Redis (%s); reconnecting", exc)
                self._stopping.wait(1)

    def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self._channel)
            while not self._stopping.is_set():
                message = pubsub.get_message(timeout=1.0)
                if message is not None:
                    self._runtime.cancel(decode_ids(message["data"]))
        finally:
            pubsub.close()
