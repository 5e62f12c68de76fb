"""A thread that keeps this worker's heartbeat (its status) fresh in Redis."""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import UTC, datetime

from redis.exceptions import RedisError

from inferq.broker.worker_registry import HEARTBEAT_EVERY_S, WorkerRegistry, WorkerStatus
from worker.runtime import EngineRuntime

log = logging.getLogger(__name__)


class Heartbeat:
    def __init__(
        self,
        registry: WorkerRegistry,
        *,
        runtime: EngineRuntime,
        model: str,
        runner: str,
        adapters: list[str],
        gpus: list[str],
    ) -> None:
        self._registry = registry
        self._runtime = runtime
        self._model = model
        self._runner = runner
        self._adapters = adapters
        self._gpus = gpus
        self._started_at = datetime.now(UTC).isoformat()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)

    def start(self) -> None:
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(2)
        with contextlib.suppress(RedisError):
            self._registry.leave(self._runtime.worker_name)

    def _run(self) -> None:
        while not self._stopping.wait(HEARTBEAT_EVERY_S):
            self._beat()

    def _beat(self) -> None:
        minute = self._runtime.last_minute.total()
        status = WorkerStatus(
            name=self._runtime.worker_name,
            model=self._model,
            runner=self._runner,
            adapters=self._adapters,
            gpus=self._gpus,
            started_at=self._started_at,
            jobs_held=self._runtime.held,
            sequences_in_flight=self._runtime.loop.sequences,
            engine_restarts=self._runtime.loop.engine_restarts,
            jobs_last_minute=minute.jobs,
            prompt_tokens_last_minute=minute.prompt_tokens,
            generated_tokens_last_minute=minute.generated_tokens,
        )
        try:
            self._registry.beat(status)
        except RedisError as exc:
            log.warning("heartbeat failed: %s", exc)
