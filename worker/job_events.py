"""Listens for cancellations, so that a job held here is aborted in the engine at once,
and for batch lines queued on this worker's queue, so that its feeder looks at once."""

from __future__ import annotations

import logging

from redis import Redis
from redis.exceptions import RedisError

from inferq.broker.events import cancel_channel, decode_ids, lines_channel
from inferq.host import supervision
from worker.gpu_worker import GpuWorker

log = logging.getLogger(__name__)

# How long one read waits for a message, which bounds how long `stop` takes.
READ_S = 1.0
# How long to wait before subscribing again after Redis was lost.
RECONNECT_S = 1.0


class JobEventListener(supervision.SupervisedThread):
    """A thread subscribed to the cancel channel, and to `batch_queue`'s lines. A missed
    cancellation is caught later by lease renewal, which drops jobs this worker no longer
    holds; missed lines, by the feeder's next look."""

    thread_name = "job-events"
    stop_timeout_s = 2

    def __init__(
        self,
        redis: Redis,
        *,
        key_prefix: str,
        gpu_worker: GpuWorker,
        batch_queue: str | None = None,
    ) -> None:
        self._redis = redis
        self._cancel = cancel_channel(key_prefix)
        self._lines = None if batch_queue is None else lines_channel(key_prefix, batch_queue)
        self._gpu_worker = gpu_worker
        super().__init__()

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen()
            except RedisError as exc:
                log.warning("job event listener lost Redis (%s); reconnecting", exc)
                self._stopping.wait(RECONNECT_S)

    def _listen(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(*filter(None, (self._cancel, self._lines)))
            while not self._stopping.is_set():
                message = pubsub.get_message(timeout=READ_S)
                if message is None:
                    continue
                channel = message["channel"]
                if (channel.decode() if isinstance(channel, bytes) else channel) == self._lines:
                    self._gpu_worker.wake_batches()
                else:
                    self._gpu_worker.cancel(decode_ids(message["data"]))
        finally:
            pubsub.close()
