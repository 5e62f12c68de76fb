"""The work batches in progress hold, read from their rows' counters (nothing is counted
over their lines), and their estimates written back (inferq/domain/estimates.py)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import InstrumentedAttribute

from inferq.domain.batches import BatchStatus
from inferq.domain.estimates import BatchWork, Estimate
from inferq.store.base import Store, as_utc
from inferq.store.models import ApiKeyRow, BatchRow


def tenant_weight(
    tenant: ColumnElement[str] | InstrumentedAttribute[str] | str,
) -> ColumnElement[int]:
    """A tenant's weight in the share of batch work: the largest of its live keys' (1
    without one; inferq/domain/fair_share.py)."""
    return func.coalesce(
        select(func.max(ApiKeyRow.weight))
        .where(ApiKeyRow.tenant == tenant, ApiKeyRow.revoked_at.is_(None))
        .scalar_subquery(),
        1,
    )


@dataclass(frozen=True, kw_only=True)
class ModelWork:
    """A batch's work, with the model its lines name."""

    model: str | None
    work: BatchWork


class BatchWorkStore(Store):
    def in_progress(self) -> list[ModelWork]:
        """Every batch in progress, oldest first."""
        query = (
            select(
                BatchRow.id,
                BatchRow.model,
                BatchRow.created_at,
                BatchRow.request_total,
                BatchRow.request_completed,
                BatchRow.request_failed,
                BatchRow.line_prompt_tokens,
                BatchRow.line_max_tokens,
                BatchRow.line_longest_tokens,
                BatchRow.input_tokens,
                BatchRow.output_tokens,
                BatchRow.tenant,
                BatchRow.priority,
                BatchRow.expires_at,
                tenant_weight(BatchRow.tenant).label("weight"),
            )
            .where(BatchRow.status == BatchStatus.IN_PROGRESS.value)
            .order_by(BatchRow.created_at, BatchRow.id)
        )
        with self._transaction() as session:
            return [
                ModelWork(
                    model=row.model,
                    work=BatchWork(
                        batch_id=row.id,
                        created_at=as_utc(row.created_at),
                        lines=row.request_total,
                        ended=row.request_completed + row.request_failed,
                        succeeded=row.request_completed,
                        prompt_tokens=row.line_prompt_tokens,
                        max_tokens=row.line_max_tokens,
                        longest_tokens=row.line_longest_tokens,
                        input_tokens=row.input_tokens,
                        output_tokens=row.output_tokens,
                        tenant=row.tenant,
                        weight=float(max(row.weight, 1)),
                        priority=row.priority,
                        expires_at=as_utc(row.expires_at),
                    ),
                )
                for row in session.execute(query)
            ]

    def tenant_weight(self, tenant: str) -> float:
        with self._transaction() as session:
            return float(max(session.scalar(select(tenant_weight(tenant))) or 1, 1))

    def save_estimates(self, estimates: Mapping[str, Estimate | None]) -> None:
        """Write each batch's estimate (only while it is in progress: one that has just
        ended keeps none). Rows are locked in id order, as the writers of results lock
        them (inferq/store/batch_counts.py)."""
        if not estimates:
            return
        with self._transaction() as session:
            for batch_id, estimate in sorted(estimates.items()):
                session.execute(
                    update(BatchRow)
                    .where(
                        BatchRow.id == batch_id,
                        BatchRow.status == BatchStatus.IN_PROGRESS.value,
                    )
                    .values(estimate=None if estimate is None else estimate.to_dict())
                    .execution_options(synchronize_session=False)
                )
