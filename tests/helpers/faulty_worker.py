"""`inferq` with a fault the tests inject:

- `INFERQ_TEST_KILL_ENGINE_SEED`: a request with this seed SIGKILLs vLLM's engine core as
  it enters the engine (as a crash of the core would), each time it does, while the
  worker process itself lives on.
- `INFERQ_TEST_RAISE_ONCE`: the first call of one piece raises an error nobody planned
  for (`claim`: the first claim of jobs in Postgres, a task's or the batch feeder's;
  `announce`: the announcement of committed results, inside the result writer's thread).
- `INFERQ_TEST_DIE_ON_SIGUSR1`: each SIGUSR1 makes the next announcement of committed
  results raise, inside the result writer's thread (the chaos run's thread death, sent
  from outside while the worker serves). Celery's own SIGUSR1 handler, which logs every
  thread's stack, is not installed.
- `INFERQ_TEST_DEAF_CONTROL`: Celery's remote control refuses `add_consumer` (as a worker
  whose control channel is gone too would not do it).
- `INFERQ_TEST_SILENT_BEAT`: `inferq beat` runs on and sends nothing.

Run as `python -m tests.helpers.faulty_worker worker --name ...` (the arguments of
`python -m cli.main`; `start_worker`'s `kill_engine_seed`, `raise_once`, `deaf_control`
and `die_on_sigusr1` do both). It
wraps the pieces before the worker imports them, then runs the CLI: only a worker a test
starts this way has the fault.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import TYPE_CHECKING, Any

from celery import beat
from celery.apps import worker as celery_worker
from celery.worker import control

from inferq.broker.events import JobEvents
from inferq.store.jobs import JobStore
from worker.engine import factory

if TYPE_CHECKING:
    from inferq.settings import EngineSettings
    from worker.engine.protocol import Engine, EngineRequest
    from worker.engine.vllm.generate import VllmEngine

SEED_VARIABLE = "INFERQ_TEST_KILL_ENGINE_SEED"
RAISE_VARIABLE = "INFERQ_TEST_RAISE_ONCE"
DEAF_VARIABLE = "INFERQ_TEST_DEAF_CONTROL"
SILENT_BEAT_VARIABLE = "INFERQ_TEST_SILENT_BEAT"
DIE_ON_SIGUSR1_VARIABLE = "INFERQ_TEST_DIE_ON_SIGUSR1"

log = logging.getLogger(__name__)


class SeedKillsEngine:
    """vLLM's engine as `build_engine` made it, but a request with `seed` kills its core (a
    process of its own) once added."""

    def __init__(self, engine: VllmEngine, *, seed: int) -> None:
        self._engine = engine
        self._seed = seed

    def add(self, request: EngineRequest) -> None:
        self._engine.add(request)
        if request.sampling.seed == self._seed:
            log.warning("fault hook: request %s kills the engine core", request.job_id)
            # As the watchdog kills a hung core.
            self._engine.kill_core()

    def __getattr__(self, name: str) -> Any:
        # The rest of the Engine interface, and what registration reads (max_model_len, ...).
        return getattr(self._engine, name)


class InjectedFault(RuntimeError):
    """Raised by a piece the test chose (`INFERQ_TEST_RAISE_ONCE`)."""


def raise_once(owner: type, name: str) -> None:
    """`owner.name` raises `InjectedFault` the first time it is called, then works."""
    method = getattr(owner, name)
    raised = threading.Event()

    def faulty(*args: Any, **kwargs: Any) -> Any:
        if not raised.is_set():
            raised.set()
            log.warning("fault hook: %s.%s raises once", owner.__name__, name)
            raise InjectedFault(f"injected into {owner.__name__}.{name}")
        return method(*args, **kwargs)

    setattr(owner, name, faulty)


def raise_after_sigusr1(owner: type, name: str) -> None:
    """`owner.name` raises `InjectedFault` the first time it is called after each SIGUSR1."""
    method = getattr(owner, name)
    armed = threading.Event()

    def faulty(*args: Any, **kwargs: Any) -> Any:
        if armed.is_set():
            armed.clear()
            log.warning("fault hook: %s.%s raises after SIGUSR1", owner.__name__, name)
            raise InjectedFault(f"injected into {owner.__name__}.{name}")
        return method(*args, **kwargs)

    setattr(owner, name, faulty)
    # Installed first thing, so a signal during the model's load arms the fault rather
    # than ending the process (SIGUSR1's default); Celery's worker would replace it.
    signal.signal(signal.SIGUSR1, lambda *_: armed.set())
    celery_worker.install_cry_handler = lambda *_, **__: None


def _raising_pieces() -> None:
    piece = os.environ.get(RAISE_VARIABLE)
    if piece == "claim":
        raise_once(JobStore, "claim_jobs")
    elif piece == "announce":
        raise_once(JobEvents, "finished")
    elif piece is not None:
        raise SystemExit(f"{RAISE_VARIABLE}={piece!r}: claim or announce")
    if DIE_ON_SIGUSR1_VARIABLE in os.environ:
        raise_after_sigusr1(JobEvents, "finished")


def main() -> None:
    if SEED_VARIABLE in os.environ:
        seed = int(os.environ[SEED_VARIABLE])
        build_engine = factory.build_engine

        def build_faulty_engine(settings: EngineSettings) -> Engine:
            engine: Any = build_engine(settings)
            return SeedKillsEngine(engine, seed=seed)

        factory.build_engine = build_faulty_engine
    _raising_pieces()
    if DEAF_VARIABLE in os.environ:

        def deaf(*_: Any, **__: Any) -> dict[str, str]:
            return control.nok("fault hook: this worker cannot consume again")

        control.Panel.data["add_consumer"] = deaf
    if SILENT_BEAT_VARIABLE in os.environ:

        def silent(self: beat.Scheduler, entry: beat.ScheduleEntry, **_: Any) -> None:
            log.warning("fault hook: beat does not send %s", entry.task)

        beat.Scheduler.apply_async = silent  # type: ignore[assignment,method-assign]
    # Imported only now: the worker's modules bind `build_engine` when they are imported.
    from cli.main import main as inferq

    inferq()


if __name__ == "__main__":
    main()
