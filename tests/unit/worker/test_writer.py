"""The result writer batches under load without delaying a lone result."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any, cast

from inferq.domain.jobs import JobOutcome, JobResult
from inferq.store.jobs import JobStore
from worker.writer import ResultWriter


class _Store:
    """Records every bulk write; each one succeeds."""

    def __init__(self) -> None:
        self.writes: list[list[str]] = []

    def finish_jobs(self, outcomes: Sequence[JobOutcome]) -> list[str]:
        ids = [o.job_id for o in outcomes]
        self.writes.append(ids)
        return ids


def _writer(flush_ms: int) -> tuple[ResultWriter, _Store, list[list[str]], threading.Event]:
    store = _Store()
    committed: list[list[str]] = []
    changed = threading.Event()

    def on_committed(_outcomes: Sequence[JobOutcome], written: Sequence[str]) -> None:
        committed.append(list(written))
        changed.set()

    writer = ResultWriter(
        store=cast(JobStore, cast(Any, store)), flush_ms=flush_ms, on_committed=on_committed
    )
    writer.start()
    return writer, store, committed, changed


def _outcome(job_id: str) -> JobOutcome:
    return JobOutcome(job_id=job_id, result=JobResult(choices=(), prompt_tokens=1))


def test_a_result_after_a_quiet_spell_is_written_without_waiting_for_the_flush() -> None:
    writer, _, committed, changed = _writer(flush_ms=60_000)
    try:
        writer.put(_outcome("a"))
        # Far less than the minute a flush could wait.
        assert changed.wait(10)
        assert committed == [["a"]]
    finally:
        writer.stop()


def test_results_that_follow_a_write_closely_gather_into_one_write() -> None:
    writer, store, committed, changed = _writer(flush_ms=500)
    try:
        writer.put(_outcome("a"))
        assert changed.wait(10)
        changed.clear()
        for job_id in ("b", "c", "d"):
            writer.put(_outcome(job_id))
        assert changed.wait(10)
        assert store.writes == [["a"], ["b", "c", "d"]]
        assert committed == store.writes
    finally:
        writer.stop()
