"""`inferq` with a fault the tests inject into its engine: a request with a given seed
SIGKILLs vLLM's engine core as it enters the engine (as a crash of the core would), each
time it does, while the worker process itself lives on.

Run as `python -m tests.helpers.faulty_worker worker --name ...` (the arguments of
`python -m cli.main`) with `INFERQ_TEST_KILL_ENGINE_SEED` set (`start_worker`'s
`kill_engine_seed` does both). It wraps the engine factory before the worker imports it,
then runs the CLI: only a worker a test starts this way can be killed by a request.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from worker.engine import factory

if TYPE_CHECKING:
    from inferq.settings import EngineSettings
    from worker.engine.protocol import Engine, EngineRequest
    from worker.engine.vllm.generate import VllmEngine

SEED_VARIABLE = "INFERQ_TEST_KILL_ENGINE_SEED"

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


def main() -> None:
    seed = int(os.environ[SEED_VARIABLE])
    build_engine = factory.build_engine

    def build_faulty_engine(settings: EngineSettings) -> Engine:
        engine: Any = build_engine(settings)
        return SeedKillsEngine(engine, seed=seed)

    factory.build_engine = build_faulty_engine
    # Imported only now: the worker's modules bind `build_engine` when they are imported.
    from cli.main import main as inferq

    inferq()


if __name__ == "__main__":
    main()
