"""The result writer batches under load without delaying a lone result."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from inferq.domain.jobs import JobOutcome, JobResult
from inferq.store.jobs import JobStore
from worker.writer import BULK_GATHER, ResultWriter


class _Store:
    """Records every bulk write; each one succeeds."""

    def __init__(self) -> None:
        self.writes: list[list[str]] = []
        self.times: list[datetime | None] = []

    def finish_jobs(
        self, outcomes: Sequence[JobOutcome], *, now: datetime | None = None
    ) -> list[str]:
        ids = [o.job_id for o in outcomes]
        self.writes.append(ids)
        self.times.append(now)
        return ids


def _writer(
    flush_ms: int, *, bulk_wait_s: float = 60, more_coming: bool = True
) -> tuple[ResultWriter, _Store, list[list[str]], threading.Event]:
    store = _Store()
    committed: list[list[str]] = []
    changed = threading.Event()

    class Ends:
        def committed(
            self, _outcomes: Sequence[JobOutcome], written: Sequence[str], *, finished_at: datetime
        ) -> None:
            # What the jobs' ends announce is when the store says they finished.
            assert finished_at == store.times[-1]
            committed.append(list(written))
            changed.set()

        def more_coming(self) -> bool:
            return more_coming

    writer = ResultWriter(
        store=cast(JobStore, cast(Any, store)),
        flush_ms=flush_ms,
        ends=Ends(),
        bulk_wait_s=bulk_wait_s,
    )
    writer.start()
    return writer, store, committed, changed


def _outcome(job_id: str, *, bulk: bool = False) -> JobOutcome:
    return JobOutcome(job_id=job_id, result=JobResult(choices=(), prompt_tokens=1), bulk=bulk)


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


def test_batch_lines_ending_apart_wait_to_share_one_write() -> None:
    writer, store, _, changed = _writer(flush_ms=0)
    writer.put(_outcome("a", bulk=True))
    writer.put(_outcome("b", bulk=True))
    # A single job's result would have been written at once (flush_ms=0).
    assert not changed.wait(0.5)
    writer.stop()  # writes what it holds
    assert store.writes == [["a", "b"]]


def test_a_lone_batch_line_is_written_after_the_wait() -> None:
    writer, store, _, changed = _writer(flush_ms=0, bulk_wait_s=0.05)
    try:
        writer.put(_outcome("a", bulk=True))
        assert changed.wait(10)
        assert store.writes == [["a"]]
    finally:
        writer.stop()


def test_a_batch_line_goes_at_once_when_nothing_more_is_on_its_way() -> None:
    writer, store, _, changed = _writer(flush_ms=0, more_coming=False)
    try:
        writer.put(_outcome("last", bulk=True))
        assert changed.wait(10)  # not the minute a line may wait
        assert store.writes == [["last"]]
    finally:
        writer.stop()


def test_a_single_jobs_result_takes_waiting_lines_along_at_once() -> None:
    writer, store, _, changed = _writer(flush_ms=0)
    try:
        writer.put(_outcome("line", bulk=True))
        writer.put(_outcome("job"))
        assert changed.wait(10)  # not the minute a line may wait
        assert store.writes == [["line", "job"]]
    finally:
        writer.stop()


def test_lines_are_written_once_enough_have_gathered() -> None:
    writer, store, _, changed = _writer(flush_ms=0)
    try:
        for i in range(BULK_GATHER + 1):
            writer.put(_outcome(f"l{i}", bulk=True))
        assert changed.wait(10)  # not the minute a line may wait
        assert store.writes[0] == [f"l{i}" for i in range(BULK_GATHER)]
    finally:
        writer.stop()
