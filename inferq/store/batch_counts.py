"""A batch's request counts and usage, kept on its row by the transaction that ends its
lines, so that reading a batch (or a page of them) counts nothing.

Lock order: a transaction that ends lines locks their batches' rows first, then the lines,
as cancelling a batch does; the other order would deadlock against it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, bindparam, select, update
from sqlalchemy.orm import Session

from inferq.domain.jobs import JobStatus
from inferq.store.models import BatchRow, JobRow


@dataclass(frozen=True)
class EndedLine:
    batch_id: str
    status: str
    prompt_tokens: int
    completion_tokens: int | None


def batches_of_locked(ids: str) -> Select[str]:
    """The rows of the batches of the jobs whose ids the list parameter `ids` holds,
    locked in id order."""
    return (
        select(BatchRow.id)
        .where(
            BatchRow.id.in_(
                select(JobRow.batch_id).where(JobRow.id.in_(bindparam(ids, expanding=True)))
            )
        )
        .order_by(BatchRow.id)
        .with_for_update()
    )


# One statement, built once.
_LOCK_BATCHES_OF = batches_of_locked("ids")


def lock_batches_of(session: Session, job_ids: Collection[str]) -> None:
    """Lock the rows of the batches these jobs belong to (none, for single jobs)."""
    session.connection().execute(_LOCK_BATCHES_OF, {"ids": list(job_ids)}).all()


def count_ended(session: Session, lines: Iterable[EndedLine]) -> None:
    """Add lines that just ended to their batches' counters (one update per batch)."""
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for line in lines:
        total = totals[line.batch_id]
        if line.status == JobStatus.SUCCEEDED.value:
            total[0] += 1
            total[2] += line.prompt_tokens
            total[3] += line.completion_tokens or 0
        else:
            total[1] += 1
    for batch_id, (completed, failed, input_tokens, output_tokens) in totals.items():
        session.execute(
            update(BatchRow)
            .where(BatchRow.id == batch_id)
            .values(
                request_completed=BatchRow.request_completed + completed,
                request_failed=BatchRow.request_failed + failed,
                input_tokens=BatchRow.input_tokens + input_tokens,
                output_tokens=BatchRow.output_tokens + output_tokens,
            )
            .execution_options(synchronize_session=False)
        )


def count_finished(
    session: Session, rows: Iterable[Any], values: Mapping[str, Mapping[str, Any]]
) -> None:
    """Count the batch lines among jobs just ended: `rows` have `id`, `batch_id` and
    `prompt_tokens`; `values` are the values that ended each, by job id."""
    count_ended(
        session,
        (
            EndedLine(
                row.batch_id,
                values[row.id]["status"],
                row.prompt_tokens,
                values[row.id].get("completion_tokens"),
            )
            for row in rows
            if row.batch_id is not None
        ),
    )
