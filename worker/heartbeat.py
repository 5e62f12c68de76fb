"""A thread that keeps this worker's heartbeat (its status) fresh in Redis, and what it
measured of its engine (worker/speedometer.py) in Postgres for batch estimates.

The status says whether the worker has room and whether it is stuck, so that `/v1/status`,
`inferq doctor` and maintenance (which counts jobs that wait while workers have room) see
what its probes see."""

from __future__ import annotations

import contextlib
import logging
import time
from datetime import UTC, datetime

from redis.exceptions import RedisError

from inferq.broker.worker_registry import HEARTBEAT_EVERY_S, WorkerRegistry, WorkerStatus
from inferq.exceptions import BrokerUnavailable, StoreUnavailable
from inferq.host import supervision
from inferq.store.engine_speeds import SpeedStore
from worker.gpu_worker import GpuWorker
from worker.probes import State

log = logging.getLogger(__name__)

# Until a rate measured at load is reported, a busy engine's is reported this often: a
# fresh deployment's first batch has no estimate until that rate is in Postgres.
FIRST_RATE_EVERY_S = 1.0


class Heartbeat(supervision.SupervisedThread):
    """Beats for this worker, and reports its engine's speed, in its own thread."""

    thread_name = "heartbeat"
    stop_timeout_s = 2

    def __init__(
        self,
        registry: WorkerRegistry,
        *,
        gpu_worker: GpuWorker,
        model: str,
        runner: str,
        adapters: list[str],
        gpus: list[str],
        speeds: SpeedStore,
        state: State,
        slots: int,
    ) -> None:
        """`slots`: the messages the worker holds at once (Celery's concurrency)."""
        self._registry = registry
        self._state = state
        self._slots = slots
        self._speeds = speeds
        self._gpu_worker = gpu_worker
        self._model = model
        self._runner = runner
        self._adapters = adapters
        self._gpus = gpus
        self._started_at = datetime.now(UTC).isoformat()
        self._rate_reported = False
        super().__init__()

    def start(self) -> None:
        """Beat once, then every `HEARTBEAT_EVERY_S` in the thread."""
        self._beat()
        super().start()

    def stop(self, timeout_s: float | None = None) -> None:
        """End the thread, then take this worker off the registry."""
        super().stop(timeout_s)
        with contextlib.suppress(RedisError):
            self._registry.leave(self._gpu_worker.worker_name)

    def _run(self) -> None:
        beat_at = time.monotonic()
        while not self._stopping.wait(
            HEARTBEAT_EVERY_S if self._rate_reported else FIRST_RATE_EVERY_S
        ):
            if time.monotonic() - beat_at >= HEARTBEAT_EVERY_S - FIRST_RATE_EVERY_S / 2:
                beat_at = time.monotonic()
                self._beat()
            elif self._gpu_worker.loop.sequences:
                self._report_speed()

    def _beat(self) -> None:
        minute = self._gpu_worker.last_minute.total()
        taken, room = self._gpu_worker.progress(slots=self._slots)
        status = WorkerStatus(
            name=self._gpu_worker.worker_name,
            model=self._model,
            runner=self._runner,
            adapters=self._adapters,
            gpus=self._gpus,
            started_at=self._started_at,
            jobs_held=self._gpu_worker.held,
            sequences_in_flight=self._gpu_worker.loop.sequences,
            engine_restarts=self._gpu_worker.loop.engine_restarts,
            jobs_last_minute=minute.jobs,
            prompt_tokens_last_minute=minute.prompt_tokens,
            generated_tokens_last_minute=minute.generated_tokens,
            # Until it consumes, a free thread takes nothing from the queues.
            room=self._state.ready and room,
            stuck=self._state.stuck,
            taken=taken,
        )
        try:
            self._registry.beat(status)
            self._gpu_worker.peers = self._peers()
        except (RedisError, BrokerUnavailable) as exc:
            log.warning("heartbeat failed: %s", exc)
        self._report_speed()

    def _peers(self) -> int:
        """Workers of this model and runner online, this one included: they share its
        batch lines (worker/feeder.py)."""
        online = self._registry.online()
        mine = sum(1 for w in online if w.model == self._model and w.runner == self._runner)
        return max(1, mine)

    def _report_speed(self) -> None:
        reading = self._gpu_worker.speed.reading()
        try:
            self._speeds.report(
                worker=self._gpu_worker.worker_name,
                model=self._model,
                runner=self._runner,
                tokens_per_s=reading.full_tokens_per_s,
                fallback_tokens_per_s=reading.busy_tokens_per_s,
                step_s=reading.tail_step_s,
                output_fraction=reading.output_fraction,
                interactive_tokens_per_s=reading.interactive_tokens_per_s,
            )
        except StoreUnavailable as exc:
            log.warning("could not record the engine's speed: %s", exc.message)
            return
        self._rate_reported = self._rate_reported or reading.full_tokens_per_s is not None
