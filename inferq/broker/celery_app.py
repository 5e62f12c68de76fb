"""The Celery app (Redis broker, JSON only) and the publisher the API uses."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

from celery import Celery
from celery.utils.nodenames import default_nodename
from kombu import Exchange, Queue

from inferq.broker import redis_transport
from inferq.constants import (
    DELIVER_WEBHOOKS_TASK,
    FINALIZE_BATCH_TASK,
    MAINTAIN_TASK,
    MAINTENANCE_QUEUE,
    RUN_JOBS_TASK,
    SERVICE_QUEUES,
    WEBHOOKS_QUEUE,
)
from inferq.domain.queue_names import gpu_queues
from inferq.exceptions import BrokerUnavailable

log = logging.getLogger(__name__)

# Most single jobs one message carries (they are published together when they are
# submitted together, see api/grouping.py).
SINGLE_JOB_CHUNK_SIZE = 16

# Every queue hangs off the default (nameless) exchange with its own name as routing key.
# kombu's Redis transport looks other exchanges up in binding keys it keeps in Redis;
# if Redis loses its data those keys are gone and messages are silently dead-lettered.
_DEFAULT_EXCHANGE = Exchange("", type="direct")


def _queue(name: str) -> Queue:
    return Queue(name, _DEFAULT_EXCHANGE, routing_key=name)


class BrokerSettings(Protocol):
    """What the Celery app is made from: `inferq.settings.ConnectionSettings` has it."""

    @property
    def redis_url(self) -> str: ...
    @property
    def redis_key_prefix(self) -> str: ...


class PublisherSettings(BrokerSettings, Protocol):
    """What a publisher is made from: the broker's settings and the worker's chunk size
    (`inferq.settings.Settings` has both)."""

    @property
    def effective_bulk_chunk_size(self) -> int: ...


def make_celery(
    settings: BrokerSettings, *, name: str = "inferq", serving: str | None = None
) -> Celery:
    """The Celery app; a GPU worker's (`serving` its model) declares its model's queues."""
    # Redis's transport, with a connection let go after a failure failing as a lost
    # connection (which Celery rides out) rather than as a bug (which ends the worker).
    redis_transport.install()
    app = Celery(name, broker=settings.redis_url, set_as_current=False)
    model_queues = () if serving is None else gpu_queues(serving)
    app.conf.update(
        # JSON only: a pickled message can carry code, so the worker refuses anything else.
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        # Results live in Postgres, never in Celery's backend.
        task_ignore_result=True,
        task_store_errors_even_if_ignored=False,
        # Acknowledge only after the result is committed; a worker that stops puts back
        # what it has not finished.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        broker_transport_options={
            # A message taken is kombu's to keep until it is acknowledged, in the worker's
            # memory only: it goes back to its queue when the worker stops, not when it
            # dies. Postgres brings back what a dead worker held (its jobs' leases lapse;
            # a job whose message was taken but never claimed is published again:
            # housekeeper/maintenance.py). Kombu's own record of taken messages in Redis,
            # redelivered after a visibility timeout, cost a transaction in Redis for
            # each message taken and another for each one acknowledged.
            "ack_emulation": False,
            "global_keyprefix": settings.redis_key_prefix,
            # A worker with a free slot takes a waiting single job before a batch chunk
            # (the queues in the order the worker names them), not in turn.
            "queue_order_strategy": "priority",
        },
        broker_connection_retry_on_startup=True,
        task_queues=[_queue(q) for q in (*model_queues, *SERVICE_QUEUES)],
        task_routes={
            MAINTAIN_TASK: {"queue": MAINTENANCE_QUEUE},
            FINALIZE_BATCH_TASK: {"queue": MAINTENANCE_QUEUE},
            DELIVER_WEBHOOKS_TASK: {"queue": WEBHOOKS_QUEUE},
        },
        task_default_queue=MAINTENANCE_QUEUE,
        task_default_exchange="",
        task_create_missing_queues=False,
        # Task events feed only Flower, and cost four Redis commands a message: workers
        # send them once Flower asks (it broadcasts `enable_events` when it starts and
        # again periodically; they stay on until the worker restarts), and publishers never
        # send "task-sent".
        worker_send_task_events=False,
        task_send_sent_event=False,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=False,
    )
    return app


def consume_again(app: Celery, *, node: str, queues: Sequence[str]) -> bool:
    """Ask the worker `node` to consume `queues` again, through Celery's remote control
    (as an operator would); True if it said it does for each. A worker whose control
    channel is gone too says nothing."""
    name = default_nodename(node)
    for queue in queues:
        try:
            replies = app.control.add_consumer(queue, destination=[name], reply=True, timeout=5)
        except Exception as exc:  # noqa: BLE001 - whatever the broker says, it did not work
            log.warning("could not ask %s to consume %s again: %s", name, queue, exc)
            return False
        if not any("ok" in reply.get(name, {}) for reply in replies):
            log.warning("%s did not consume %s again: %s", name, queue, replies)
            return False
    return True


class JobPublisher:
    """Publishes job ids to the GPU queues (inferq/broker/queues.py names them): single jobs a few
    to a message, file lines in chunks."""

    def __init__(self, app: Celery, *, bulk_chunk_size: int) -> None:
        self._app = app
        self._bulk_chunk_size = bulk_chunk_size

    @classmethod
    def from_settings(cls, settings: PublisherSettings, app: Celery | None = None) -> JobPublisher:
        """A publisher on `app` (a new Celery app if None) with the configured chunk size."""
        return cls(app or make_celery(settings), bulk_chunk_size=settings.effective_bulk_chunk_size)

    def publish_interactive(self, job_ids: Sequence[str], *, queue: str) -> None:
        """Jobs submitted together, a few to a message: fewer messages for the worker to
        take, while several workers still share a burst."""
        self._publish(job_ids, queue, SINGLE_JOB_CHUNK_SIZE)

    def publish_bulk(self, job_ids: Sequence[str], *, queue: str) -> None:
        """Wake the feeders of `queue`'s workers: batch lines are waiting. One message
        however many lines (it names the first few, for Flower): the feeders claim lines
        from Postgres, in the order work is shared (worker/feeder.py)."""
        if job_ids:
            self._send(list(job_ids[: self._bulk_chunk_size]), queue)

    def _publish(self, job_ids: Sequence[str], queue: str, size: int) -> None:
        # One producer (and its connection) for all the chunks, not one per message.
        with _broker_errors(), self._app.producer_or_acquire() as producer:
            for start in range(0, len(job_ids), size):
                self._send(list(job_ids[start : start + size]), queue, producer)

    def publish_finalize(self, batch_id: str) -> None:
        """Ask the housekeeper to make a finished batch's output files."""
        self._send_task(FINALIZE_BATCH_TASK, [batch_id], MAINTENANCE_QUEUE)

    def publish_webhooks(self) -> None:
        """Wake the housekeeper: webhook deliveries are due (it finds them in Postgres)."""
        self._send_task(DELIVER_WEBHOOKS_TASK, [], WEBHOOKS_QUEUE)

    def _send(self, job_ids: list[str], queue: str, producer: Any = None) -> None:
        self._send_task(RUN_JOBS_TASK, [job_ids], queue, producer)

    def _send_task(self, name: str, args: list[object], queue: str, producer: Any = None) -> None:
        with _broker_errors():
            self._app.send_task(
                name,
                args=args,
                # A Queue, not a name: model queues are not declared on publishers' apps.
                queue=_queue(queue),
                # Nor in Redis: a queue of the nameless exchange is found by its name alone,
                # and kombu's check that it was declared copied it at every message.
                declare=[],
                # What Flower shows of the arguments: their own repr, where Celery's
                # size-limited one walked them in Python.
                argsrepr=repr(args),
                producer=producer,
                retry=True,
                retry_policy={"max_retries": 3, "interval_start": 0.1, "interval_step": 0.5},
            )


@contextmanager
def _broker_errors() -> Iterator[None]:
    """Whatever the transport raised (kombu passes Redis' errors on) as `BrokerUnavailable`."""
    try:
        yield
    except BrokerUnavailable:
        raise
    except Exception as exc:
        raise BrokerUnavailable(f"could not publish to Redis: {exc}") from exc
