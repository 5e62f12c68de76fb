"""`inferq run FILE`: one batch on this machine, with no Redis, Postgres or Docker.

The pieces are a deployment's, embedded: the SQLAlchemy store and its Alembic migrations
on SQLite (the state file), and the GPU worker's gpu_worker (its feeder claims the lines
from the state file, as a worker's claims them from Postgres). A line's result is
committed to the state file before it counts as done, so a run that is interrupted
(Ctrl-C, or killed outright) and started again with the same state file skips the lines
already done and runs the others; no line is written twice.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cli.demo_model import CPU_DTYPE, DEMO, TINY, build_demo_model
from inferq.app import App
from inferq.domain.batches import Batch, BatchStatus, FilePurpose
from inferq.domain.jobs import JobStatus
from inferq.domain.queue_names import bulk_queue
from inferq.domain.served_models import served_by
from inferq.exceptions import BrokerUnavailable, InferqError
from inferq.operations.batches import BatchOperations
from inferq.settings import Settings
from inferq.store.migrate import upgrade
from inferq.wire.model_catalog import FixedModels, ModelCatalog, RequestLimits

if TYPE_CHECKING:
    from worker.engine.protocol import Engine as ModelEngine

log = logging.getLogger(__name__)

LOCAL_TENANT = "local"
LOCAL_WORKER = "inferq-run"
# How soon a run notices it was told to stop.
STOP_POLL_S = 0.05
# A local run has no API to protect: its only limits are the machine's.
NO_LIMIT = 2**62


def demo_model_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return cache / "inferq" / "demo-model"


def local_settings(settings: Settings, model: str | None) -> Settings:
    """`settings` for a run on this machine. `--model demo` builds the demo model (random
    weights: NOT a real model) and sizes the engine for it, unless the environment says
    otherwise."""
    if model is None:
        return settings
    if model != DEMO:
        return settings.model_copy(update={"model": model, "served_model_name": None})
    sized_for_demo = {
        "dtype": CPU_DTYPE,
        "enforce_eager": True,
        "max_num_seqs": 32,
        "max_batch_size": 16,
    }
    chosen = settings.model_fields_set
    return settings.model_copy(
        update={
            "model": str(build_demo_model(demo_model_dir(), TINY)),
            "served_model_name": DEMO,
            "tokenizer": None,
            **{k: v for k, v in sized_for_demo.items() if k not in chosen},
        }
    )


class StateMismatch(InferqError):
    """The state file belongs to another input file."""


@dataclass(frozen=True)
class Progress:
    total: int
    succeeded: int
    failed: int
    output_tokens: int

    @property
    def done(self) -> int:
        return self.succeeded + self.failed


class LocalRun:
    """One input file's batch in a SQLite state file, run by an embedded GPU gpu_worker."""

    def __init__(self, settings: Settings, *, state: Path) -> None:
        self.settings = settings
        self.state = state
        url = f"sqlite:///{state}"
        upgrade(url)
        # The same pieces a deployment has, on a SQLite file and with no broker.
        self._app = App(settings.model_copy(update={"database_url": url}))
        self.jobs = self._app.jobs
        self.batches = self._app.batches
        self._files = self._app.files
        self._output = self._app.batch_output

    def close(self) -> None:
        self._app.close()

    def open_batch(self, source: Path, *, endpoint: str, name: str) -> Batch:
        """The batch of `source` (the file `name`, as batch lines): the one in the state
        file, or a new one."""
        digest = _sha256(source)
        existing, _ = self.batches.page(scope=LOCAL_TENANT, after=None, limit=1)
        if existing:
            batch = existing[0]
            if batch.metadata.get("input_sha256") != digest:
                raise StateMismatch(
                    f"the state file {self.state} belongs to another input file, or other "
                    f"options ({batch.metadata.get('input_name')}); give a new --state, or "
                    "delete it to start over"
                )
            self._take_back_lines_in_flight(batch.id)
            return batch
        settings = self.settings
        models = ModelCatalog(
            FixedModels(served_by(settings)), limits=RequestLimits.from_settings(settings)
        )
        with source.open("rb") as f:
            stored = self._files.upload(
                tenant=LOCAL_TENANT,
                purpose=FilePurpose.BATCH,
                filename=source.name,
                chunks=iter(lambda: f.read(1 << 20), b""),
                max_bytes=NO_LIMIT,
            )
        return self._operations(models).create(
            tenant=LOCAL_TENANT,
            input_file_id=stored.id,
            endpoint=endpoint,
            completion_window="168h",
            metadata={"input_sha256": digest, "input_name": name},
        )

    def progress(self, batch_id: str) -> Progress:
        batch = self.batches.get(batch_id)
        counts = batch.counts
        return Progress(
            total=counts.total,
            succeeded=counts.completed,
            failed=counts.failed,
            output_tokens=batch.usage.output_tokens,
        )

    def load_engine(self) -> ModelEngine:
        """Check this host and load the model (`PreflightFailed`, `EngineStartFailed`)."""
        from inferq.host.preflight import engine_settings
        from worker.engine.factory import build_engine

        self.settings = engine_settings(self.settings)
        return build_engine(self.settings)

    def run(
        self,
        batch_id: str,
        *,
        engine: ModelEngine,
        stop: threading.Event,
        on_progress: Callable[[Progress], None],
        poll_s: float = 0.5,
    ) -> bool:
        """Run the batch's remaining lines on `engine` (closed at the end) until all have
        ended (True) or `stop` is set (False: lines in flight go back to queued, to run
        next time)."""
        from prometheus_client import CollectorRegistry

        from worker.gpu_worker import GpuWorker
        from worker.metrics import WorkerMetrics

        settings = self.settings
        on_progress(self.progress(batch_id))
        fatal: list[BaseException] = []

        def give_up(exc: BaseException) -> None:
            fatal.append(exc)
            stop.set()

        # Set when no line of the batch is held any more: its last lines may have ended,
        # which is looked at then rather than at the next poll.
        emptied = threading.Event()
        gpu_worker = GpuWorker.from_settings(
            settings,
            store=self.jobs,
            engine=engine,
            events=_NoListeners(),
            worker_name=LOCAL_WORKER,
            on_fatal=give_up,
            # Series of its own: a local run serves none, and a process may make several.
            metrics=WorkerMetrics(CollectorRegistry()),
            # The feeder claims the lines from the state file, as a worker's does.
            batch_queue=bulk_queue(settings.model_name),
            batches=_Emptied(emptied),
        )
        gpu_worker.start()
        try:
            look_at = time.monotonic() + poll_s
            while not stop.is_set():
                if not emptied.wait(STOP_POLL_S) and time.monotonic() < look_at:
                    continue
                emptied.clear()
                look_at = time.monotonic() + poll_s
                progress = self.progress(batch_id)
                on_progress(progress)
                if progress.done >= progress.total:
                    break
        finally:
            if stop.is_set():
                gpu_worker.drain(timeout_s=0)
            gpu_worker.stop()  # the engine loop closes its engine
        if fatal:
            raise InferqError(f"the engine cannot go on: {fatal[0]}")
        on_progress(self.progress(batch_id))
        if stop.is_set():
            return False
        self._output.finalize(batch_id)
        return True

    def write_results(self, batch_id: str, output: Path) -> tuple[Path | None, Path | None]:
        """Write the output file (and the error file, if any line failed) next to each other."""
        batch = self.batches.get(batch_id)
        if batch.status is not BatchStatus.COMPLETED:
            raise InferqError(f"the batch is {batch.status}, not completed")
        written: list[Path | None] = []
        for file_id, target in (
            (batch.output_file_id, output),
            (batch.error_file_id, output.with_suffix(".errors.jsonl")),
        ):
            if file_id is None:
                written.append(None)
                continue
            partial = target.with_name(target.name + ".partial")
            with partial.open("wb") as out:
                for chunk in self._output.content(self._files.get(file_id)):
                    out.write(chunk)
            partial.replace(target)
            written.append(target)
        return written[0], written[1]

    def _operations(self, models: ModelCatalog) -> BatchOperations:
        return BatchOperations(
            files=self._files,
            batches=self.batches,
            models=models,
            publisher=_NoBroker(),
            events=_NoBroker(),
            output=self._output,
            estimates=self._app.batch_estimates,
            max_lines=NO_LIMIT,
            retention_s=0,  # the state file is the user's to delete
            requeue_after_s=self.settings.requeue_after_s,
        )

    def _take_back_lines_in_flight(self, batch_id: str) -> None:
        """Lines a killed run had in the engine were never written: queue them again."""
        for job_ids in self.batches.job_id_chunks(batch_id, statuses=(JobStatus.RUNNING,)):
            self.jobs.give_back_jobs(job_ids, worker=LOCAL_WORKER, requeue_after_s=0)


class _NoBroker:
    """No broker in a local run: the feeder finds queued lines in the state file without
    being woken, and nothing is cancelled (a local batch is stopped, never cancelled)."""

    def publish_bulk(self, job_ids: Sequence[str], *, queue: str) -> None:
        pass

    def publish_finalize(self, batch_id: str) -> None:
        raise BrokerUnavailable(f"a local run finalizes its batch ({batch_id}) itself")

    def lines_queued(self, queue: str) -> None:
        pass

    def cancelled(self, job_ids: Sequence[str]) -> None:
        pass


class _Emptied:
    """Sets `event` when no line of a batch is held any more: its last lines may have
    ended, which the run then looks at rather than at its next poll."""

    def __init__(self, event: threading.Event) -> None:
        self._event = event

    def lines_ended(self, batch_ids: set[str]) -> None:  # noqa: ARG002 (any batch: the run's)
        self._event.set()


class _NoListeners:
    """Nobody long-polls a local run: finished jobs are announced to no one."""

    def finished(
        self,
        job_ids: Sequence[str],
        *,
        batch_ids: Sequence[str] = (),
        results: Mapping[str, bytes] | None = None,
    ) -> None:
        pass


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
