"""`inferq worker`: build the engine once, then consume the GPU queues with Celery."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Sequence

from celery import Celery
from celery.signals import worker_shutting_down

from inferq.app import App
from inferq.broker.celery_app import JobPublisher, consume_again, make_celery
from inferq.broker.queues import QueueMonitor
from inferq.broker.token_stream import TokenStreamWriter
from inferq.broker.worker_registry import WorkerRegistry
from inferq.domain.queue_names import bulk_queue, gpu_queues
from inferq.domain.served_models import served_by
from inferq.host import supervision
from inferq.host.preflight import engine_settings
from inferq.host.stall import EXIT_STUCK, Progress, StallWatch
from inferq.settings import Settings
from inferq.store.batches import BatchStore
from inferq.store.migrate import check_schema
from worker import probes
from worker.engine.factory import build_engine
from worker.fleet import PeerBacklog
from worker.gpu_worker import GpuWorker
from worker.heartbeat import Heartbeat
from worker.job_events import JobEventListener
from worker.metrics import WorkerMetrics, gpu_names, register_gpu_collector
from worker.registration import served_models
from worker.tasks import register_gpu_tasks
from worker.token_publisher import TokenPublisher

log = logging.getLogger(__name__)

EXIT_ENGINE_LOST = 70


def default_worker_name(model: str) -> str:
    """`gpu-<model>-<pid>@<host>`: Flower and the logs show which model a worker serves."""
    plain = re.sub(r"[^A-Za-z0-9_.-]+", "-", model.rsplit("/", 1)[-1])
    return f"gpu-{plain}-{os.getpid()}@{socket.gethostname()}"


def _die(exc: BaseException) -> None:
    # The engine cannot be brought back: leave without acknowledging anything, so every
    # held job returns to the queue (leases) and the supervisor starts a fresh process.
    log.critical("the GPU worker cannot go on: %s", exc)
    logging.shutdown()
    os._exit(EXIT_ENGINE_LOST)


def _quiet_celery_per_message() -> None:
    """Celery logs two lines a message at INFO (received, succeeded): at the rate single
    jobs come, noise that costs the worker's consumer and pool CPU. They show at DEBUG;
    failures still show at every level."""
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        for name in ("celery.app.trace", "celery.worker.strategy"):
            logging.getLogger(name).setLevel(logging.WARNING)


def _serve_metrics(port: int, state: probes.State) -> None:
    probes.serve(port, state)
    register_gpu_collector()
    log.info("metrics on :%d/metrics, probes on /livez and /readyz", port)


def _stall_watch(
    settings: Settings,
    *,
    gpu_worker: GpuWorker,
    consumer: Celery,
    queues: Sequence[str],
    monitor: QueueMonitor,
    registry: WorkerRegistry,
    worker_name: str,
) -> StallWatch:
    """The worker's progress: messages taken, room for another (a free message slot and
    room at the door), and messages waiting in its model's queues or taken by its peers
    since it last took one (worker/fleet.py)."""

    taken_by_peers = PeerBacklog(
        registry, name=worker_name, model=settings.model_name, runner=settings.runner
    )

    def read() -> Progress:
        taken, room = gpu_worker.progress(slots=settings.effective_worker_concurrency)
        elsewhere = taken_by_peers(taken)
        waiting = sum(monitor.depth(q) for q in queues) + elsewhere
        return Progress(taken=taken, room=room, waiting=waiting, taken_by_peers=elsewhere)

    def give_up(why: str) -> None:
        # Jobs in the engine get the drain's time to finish; the rest go back at once.
        gpu_worker.drain(settings.drain_timeout_s)
        log.critical("the GPU worker exits (%d) to be restarted: %s", EXIT_STUCK, why)
        logging.shutdown()
        os._exit(EXIT_STUCK)

    return StallWatch(
        name=f"GPU worker {worker_name}",
        stall_s=settings.stall_s,
        read=read,
        heal=lambda: consume_again(consumer, node=worker_name, queues=queues),
        give_up=give_up,
    )


class _BatchEndings:
    """After a batch's lines are written: if none is left, ask for its output files."""

    def __init__(self, batches: BatchStore, publisher: JobPublisher) -> None:
        self._batches = batches
        self._publisher = publisher

    def lines_ended(self, batch_ids: set[str]) -> None:
        for batch_id in self._batches.finished(sorted(batch_ids)):
            self._publisher.publish_finalize(batch_id)


def run_worker(settings: Settings, *, name: str | None = None) -> None:
    """Run a GPU worker until it is told to stop (SIGTERM or SIGINT)."""
    check_schema(settings.database_url)
    metrics = WorkerMetrics()
    state = probes.State()
    metrics.ready.set_function(lambda: float(state.ready and state.stuck is None))
    if settings.worker_metrics_port:
        # First, so a port clash fails in a second, not after the model has loaded.
        _serve_metrics(settings.worker_metrics_port, state)
    worker_name = name or default_worker_name(settings.model_name)
    # Before anything loads: one line and a non-zero exit if this host cannot run the model.
    settings = engine_settings(settings)
    # Every store call of the worker is retried, so a database restart may cost one. The
    # threads that claim and flush (Celery's consumer, the feeder, the writer) keep a
    # connection each, beside the pool's four for the rest.
    app = App(settings, pool_size=7, pre_ping=False, keep_connections=True)
    # Known before the weights load (minutes, for a large model): the API accepts and
    # queues the model's work from now on, where it would say 404 until the worker is up.
    if announced := app.served_models.announce(served_by(settings)):
        log.info("announced %s: its work is accepted while the model loads", ", ".join(announced))
    engine = build_engine(settings)
    tokens = TokenPublisher(
        TokenStreamWriter(
            app.redis,
            key_prefix=settings.redis_key_prefix,
            max_entries=settings.stream_max_entries,
            ttl_s=settings.stream_ttl_s,
        )
    )
    gpu_worker = GpuWorker.from_settings(
        settings,
        store=app.jobs,
        engine=engine,
        events=app.events,
        worker_name=worker_name,
        on_fatal=_die,
        metrics=metrics,
        batch_queue=bulk_queue(settings.model_name),
        batches=_BatchEndings(app.batches, app.publisher),
        tokens=tokens,
    )
    model = settings.model_name
    cancels = JobEventListener(
        app.redis,
        key_prefix=settings.redis_key_prefix,
        gpu_worker=gpu_worker,
        batch_queue=bulk_queue(settings.model_name),
    )
    queues = gpu_queues(model)
    consumer = make_celery(settings, serving=model)
    # SIGINT/SIGQUIT (cold shutdown) wait as long as the drain does before cancelling.
    consumer.conf.worker_soft_shutdown_timeout = settings.drain_timeout_s
    register_gpu_tasks(consumer, gpu_worker)

    def drain_on_shutdown(**_: object) -> None:
        # Celery stops consuming and waits for running tasks; the drain makes them end.
        supervision.thread(gpu_worker.drain, args=(settings.drain_timeout_s,), name="drain").start()

    worker_shutting_down.connect(drain_on_shutdown, weak=False)
    heartbeat = Heartbeat(
        app.workers,
        gpu_worker=gpu_worker,
        model=model,
        runner=settings.runner,
        adapters=sorted(settings.lora_adapters),
        gpus=gpu_names(),
        speeds=app.speeds,
        state=state,
        slots=settings.effective_worker_concurrency,
    )
    watch = state.watch = _stall_watch(
        settings,
        gpu_worker=gpu_worker,
        consumer=consumer,
        queues=queues,
        monitor=app.queues,
        registry=app.workers,
        worker_name=worker_name,
    )
    # The worker's side threads, started here and stopped in the reverse order (the
    # GpuWorker's own: worker/gpu_worker.py).
    threads = supervision.SideThreads(tokens, gpu_worker, cancels, heartbeat, watch)
    threads.start()
    # The API accepts these names from now on; their jobs wait in the queues until taken.
    served = served_models(settings, engine)
    app.served_models.register(served)
    metrics.serving(served, worker=worker_name)
    state.ready = True
    log.info(
        "GPU worker %s ready: serving %s, consuming %s",
        worker_name,
        ", ".join(m.name for m in served),
        ",".join(queues),
    )
    _quiet_celery_per_message()
    try:
        consumer.worker_main(
            [
                "worker",
                # No --pool: the tasks' own (worker/pool.py), set by register_gpu_tasks.
                f"--concurrency={settings.effective_worker_concurrency}",
                f"--queues={','.join(queues)}",
                f"--hostname={worker_name}",
                f"--loglevel={settings.log_level}",
                "--without-mingle",
                "--without-gossip",
            ]
        )
    finally:
        threads.stop()  # the engine loop closes its engine
