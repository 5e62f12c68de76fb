"""The housekeeper (`inferq webhooks`): the process with no GPU that delivers webhooks,
runs the maintenance pass and ends batches; and `inferq beat`, which schedules maintenance."""

from __future__ import annotations

import functools
import logging
import os
import socket
import tempfile
from pathlib import Path
from typing import Any

from celery import Celery

from housekeeper.fleet import FleetWatch
from housekeeper.maintenance import Maintenance
from housekeeper.retention import Retention
from housekeeper.stall import beat_watch, housekeeper_watch
from housekeeper.webhook_sender import WebhookSender
from inferq.app import App
from inferq.broker.celery_app import make_celery
from inferq.constants import (
    DELIVER_WEBHOOKS_TASK,
    FINALIZE_BATCH_TASK,
    MAINTAIN_TASK,
    MAINTENANCE_QUEUE,
    SERVICE_QUEUES,
)
from inferq.domain.webhooks import Delivery, parse_networks
from inferq.operations.batches import BatchLifecycle
from inferq.settings import Settings
from inferq.store.batches import BatchStore
from inferq.store.jobs import JobStore
from inferq.store.migrate import check_schema
from inferq.store.served_models import ModelStore
from inferq.wire.public import batch_json, job_json

log = logging.getLogger(__name__)

THREADS = 8


def register_housekeeping_tasks(
    app: Celery, maintenance: Maintenance, batches: BatchLifecycle, sender: WebhookSender
) -> None:
    @app.task(name=MAINTAIN_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
    def maintain() -> dict[str, Any]:
        """Publish again whatever Postgres says should be queued but Redis may have lost."""
        report = maintenance.run_once()
        return {"redis_lost": report.redis_lost, "republished": report.republished}

    @app.task(name=FINALIZE_BATCH_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
    def finalize_batch(batch_id: str) -> str | None:
        """Make a finished batch's output files and end it."""
        batch = batches.finalize(batch_id)
        return None if batch is None else batch.status.value

    @app.task(name=DELIVER_WEBHOOKS_TASK, ignore_result=True)  # type: ignore[untyped-decorator]
    def deliver_webhooks() -> dict[str, int]:
        """Attempt every due webhook delivery once (retries are scheduled in Postgres)."""
        return sender.deliver_due()


def _renderer(jobs: JobStore, batches: BatchStore):  # type: ignore[no-untyped-def]
    """A delivery's `data`: the job or batch object, as the API shows it."""

    def render(delivery: Delivery) -> dict[str, Any]:
        if delivery.job_id is not None:
            return job_json(jobs.get_job(delivery.job_id))
        assert delivery.batch_id is not None
        return batch_json(batches.get(delivery.batch_id))

    return render


def _bases(models: ModelStore) -> set[str]:
    """The served models whose queues maintenance watches."""
    return {model.base for model in models.all()}


def run_housekeeper(settings: Settings, *, name: str | None = None) -> None:
    check_schema(settings.database_url)
    app = App(settings, pool_size=4 + settings.webhook_concurrency)
    sender = WebhookSender(
        store=app.webhooks,
        render=_renderer(app.jobs, app.batches),
        timeout_s=settings.webhook_timeout_s,
        schedule_s=settings.webhook_retry_schedule_s,
        allowed=parse_networks(settings.webhook_allowed_networks),
        concurrency=settings.webhook_concurrency,
    )
    maintenance = Maintenance(
        store=app.jobs,
        publisher=app.publisher,
        redis=app.redis,
        key_prefix=settings.redis_key_prefix,
        requeue_after_s=settings.requeue_after_s,
        unclaimed_after_s=settings.lease_s,
        batches=app.batch_lifecycle,
        estimates=app.batch_estimates,
        webhooks_due=app.webhooks.due,
        retention=Retention(
            app.retention,
            job_retention_s=settings.job_retention_s,
            webhook_retention_s=settings.webhook_retention_s,
        ),
        fleet=FleetWatch(
            store=app.jobs,
            workers=app.workers,
            stuck=app.stuck_jobs,
            stall_s=settings.stall_s,
            # As long as `inferq health maintenance` waits for a pass.
            record_ttl_s=3 * settings.maintenance_interval_s,
        ),
        served_models=functools.partial(_bases, app.served_models),
    )
    register_housekeeping_tasks(app.celery, maintenance, app.batch_lifecycle, sender)
    node = name or f"service-{os.getpid()}@{socket.gethostname()}"
    watch = housekeeper_watch(
        celery=app.celery,
        monitor=app.queues,
        node=node,
        threads=THREADS,
        stall_s=settings.stall_s,
    )
    watch.start()
    try:
        app.celery.worker_main(
            [
                "worker",
                "--pool=threads",
                f"--concurrency={THREADS}",
                f"--queues={','.join(SERVICE_QUEUES)}",
                f"--hostname={node}",
                f"--loglevel={settings.log_level}",
                "--without-mingle",
                "--without-gossip",
            ]
        )
    finally:
        watch.stop()
        sender.close()  # deliveries under way finish first


def run_beat(settings: Settings) -> None:
    app = make_celery(settings)
    app.conf.beat_schedule = {
        "maintenance": {
            "task": MAINTAIN_TASK,
            "schedule": settings.maintenance_interval_s,
            "options": {"queue": MAINTENANCE_QUEUE, "expires": settings.maintenance_interval_s},
        }
    }
    # The schedule file only remembers when tasks last ran; a fresh one is harmless.
    schedule = Path(tempfile.gettempdir()) / f"inferq-beat-{os.getpid()}"
    beat_watch(stall_s=settings.stall_s).start()
    app.start(["beat", f"--schedule={schedule}", f"--loglevel={settings.log_level}"])
