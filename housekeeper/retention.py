"""Retention, run by maintenance: deletes single jobs `job_retention_s` after they end,
batches (lines, results, files) once their output expires, uploaded files once they
expire, webhook deliveries `webhook_retention_s` after they end, and idempotency keys once
they expire.

Every statement deletes a bounded chunk in its own transaction (see
`inferq.store.retention`), so none holds locks on a hot table for long; a pass stops after
`budget_s` and the next one goes on where it stopped. The report says how long the longest
statement took: that is the longest any lock was held.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from functools import partial

from inferq.store.base import utcnow
from inferq.store.retention import RetentionStore

log = logging.getLogger(__name__)

# Rows one statement deletes at most; deliveries carry their attempts, files their chunks
# (a megabyte each), so fewer of those.
CHUNK_ROWS = 1000
CHUNK_DELIVERIES = 200
CHUNK_FILE_CHUNKS = 64
# Expired batches looked at per pass.
BATCHES_PER_PASS = 100


@dataclass
class RetentionReport:
    deleted: dict[str, int] = field(default_factory=dict)
    statements: int = 0
    longest_statement_ms: float = 0.0
    # Whether the pass ran out of time with work left (the next pass goes on).
    unfinished: bool = False

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


class Retention:
    def __init__(
        self,
        store: RetentionStore,
        *,
        job_retention_s: int,
        webhook_retention_s: int,
        budget_s: float = 5.0,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._store = store
        self._job_retention = timedelta(seconds=job_retention_s) if job_retention_s else None
        self._webhook_retention = (
            timedelta(seconds=webhook_retention_s) if webhook_retention_s else None
        )
        self._budget_s = budget_s
        self._clock = clock

    def run_once(self) -> RetentionReport:
        """One pass, for at most `budget_s`."""
        now = self._clock()
        step = _Pass(time.monotonic() + self._budget_s)
        store = self._store
        # What to delete, in order: the kind, the statement, and the chunk it takes as its
        # `limit` (repeated until it deletes less), or None for one run.
        steps: list[tuple[str, Callable[..., int], int | None]] = []
        if self._job_retention is not None:
            before = now - self._job_retention
            steps.append(
                ("jobs", partial(store.delete_ended_jobs, ended_before=before), CHUNK_ROWS)
            )
        for batch_id in store.expired_batches(now=now, limit=BATCHES_PER_PASS):
            steps.append(("batch_lines", partial(store.delete_batch_lines, batch_id), CHUNK_ROWS))
            steps.append(("batches", partial(store.delete_batch, batch_id), None))
        steps.append(
            ("file_chunks", partial(store.delete_expired_file_chunks, now=now), CHUNK_FILE_CHUNKS)
        )
        steps.append(("files", partial(store.delete_gone_files, now=now), CHUNK_ROWS))
        if self._webhook_retention is not None:
            before = now - self._webhook_retention
            steps.append(
                (
                    "webhook_deliveries",
                    partial(store.delete_ended_deliveries, ended_before=before),
                    CHUNK_DELIVERIES,
                )
            )
        steps.append(
            (
                "idempotency_keys",
                partial(store.delete_expired_idempotency_keys, now=now),
                CHUNK_ROWS,
            )
        )
        for kind, statement, chunk in steps:
            if not step.repeat(kind, statement, chunk):
                break
        report = step.report
        if report.deleted:
            log.info(
                "retention deleted %s in %d statements (longest %.1f ms)%s",
                ", ".join(f"{n} {kind}" for kind, n in report.deleted.items()),
                report.statements,
                report.longest_statement_ms,
                "; more next pass" if report.unfinished else "",
            )
        return report


class _Pass:
    def __init__(self, deadline: float) -> None:
        self._deadline = deadline
        self.report = RetentionReport()

    def repeat(self, kind: str, statement: Callable[..., int], chunk: int | None) -> bool:
        """Run `statement(limit=chunk)` until it deletes less than `chunk` (`statement()`
        once if `chunk` is None); False if the pass ran out of time first."""
        report = self.report
        while True:
            if time.monotonic() >= self._deadline:
                report.unfinished = True
                return False
            started = time.perf_counter()
            deleted = statement() if chunk is None else statement(limit=chunk)
            elapsed_ms = (time.perf_counter() - started) * 1000
            report.longest_statement_ms = max(report.longest_statement_ms, elapsed_ms)
            report.statements += 1
            if deleted:
                report.deleted[kind] = report.deleted.get(kind, 0) + deleted
            if chunk is None or deleted < chunk:
                return True
