"""`inferq run` keeps the engine full while a batch's long lines straggle: its feeder, the
worker's, claims lines as room frees, however long the lines before them run. On a fake
engine whose steps take time, as a GPU's do; its own SQLite."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from pathlib import Path

from cli.local_run import LocalRun, Progress
from cli.prompt_files import Defaults, prepare
from inferq.settings import Settings
from tests.helpers.fakes import StepEngine
from worker.engine.protocol import Finished

MAX_NUM_SEQS = 128
CHUNK = 16
LINES = 640
LONG, SHORT = 60, 4
STEP_S = 0.02  # about a GPU's decode step


class PacedEngine(StepEngine):
    """A StepEngine whose steps take `STEP_S`."""

    def step(self) -> list[Finished]:
        time.sleep(STEP_S)
        return super().step()


def _lengths() -> list[int]:
    """One line in every 16 runs long."""
    return [LONG if i % CHUNK == 0 else SHORT for i in range(LINES)]


def _batch_file(path: Path, model: str) -> Path:
    with path.open("w") as out:
        for i, max_tokens in enumerate(_lengths()):
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"line {i}"}],
                "max_tokens": max_tokens,
            }
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            out.write(json.dumps({**line, "body": body}) + "\n")
    return path


def _steps_with_every_line_queued(lengths: list[int], slots: int) -> int:
    """The steps an engine of `slots` sequences takes when every line waits in it from the
    start (as in one `LLM.generate` call)."""
    waiting, running, steps = deque(lengths), list[int](), 0
    while waiting or running:
        while waiting and len(running) < slots:
            running.append(waiting.popleft())
        steps += 1
        running = [left - 1 for left in running if left > 1]
    return steps


def test_long_lines_do_not_starve_the_engine_of_the_lines_behind_them(
    tiny_model: Path, tmp_path: Path
) -> None:
    settings = Settings(model=str(tiny_model), max_num_seqs=MAX_NUM_SEQS, max_batch_size=CHUNK)
    local = LocalRun(settings, state=tmp_path / "run.state")
    engine = PacedEngine()
    try:
        ready = prepare(
            _batch_file(tmp_path / "batch.jsonl", settings.model_name),
            Defaults(model=settings.model_name),
            workdir=tmp_path,
        )
        batch = local.open_batch(ready.path, endpoint=ready.endpoint, name="batch.jsonl")
        seen: list[Progress] = []
        assert local.run(batch.id, engine=engine, stop=threading.Event(), on_progress=seen.append)
        assert seen[-1].succeeded == LINES
    finally:
        local.close()
    # Lines held back behind long ones would leave the engine part empty while others
    # wait; fed as room frees, it takes the ramp-up and a step or two of lag more.
    best = _steps_with_every_line_queued(_lengths(), MAX_NUM_SEQS)
    assert len(engine.batch_sizes) <= 1.5 * best, (len(engine.batch_sizes), best)
