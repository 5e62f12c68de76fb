"""The speeds the GPU workers measure of their engines (inferq/domain/estimates.py): each
worker replaces its own row at every report; a model's rows are read to estimate its
batches."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, func, select

from inferq.domain.estimates import EngineSpeed
from inferq.store.base import Store, as_utc
from inferq.store.models import EngineSpeedRow


class SpeedStore(Store):
    def report(
        self,
        *,
        worker: str,
        model: str,
        runner: str,
        tokens_per_s: float | None,
        fallback_tokens_per_s: float | None,
        step_s: float | None,
        output_fraction: float | None,
        interactive_tokens_per_s: float,
    ) -> None:
        """Record what `worker` measured. What it could not measure this time (None: its
        engine was not full long enough, say) keeps the one it last reported, or, if it
        never did, takes `fallback_tokens_per_s` (its rate at any load, kept as not measured
        at load: estimates wait for one that was);
        with neither, a worker that has never worked records nothing."""
        now = self._clock()
        with self._transaction() as session:
            row = session.get(EngineSpeedRow, worker)
            at_load = tokens_per_s is not None or (row is not None and row.at_load)
            rate = tokens_per_s or (row.tokens_per_s if row else None) or fallback_tokens_per_s
            if rate is None:
                return
            if row is None:
                row = EngineSpeedRow(worker=worker)
                session.add(row)
            row.model, row.runner, row.tokens_per_s = model, runner, rate
            row.at_load = at_load
            if output_fraction is not None:
                row.output_fraction = output_fraction
            if step_s is not None:
                row.step_s = step_s
            row.interactive_tokens_per_s = interactive_tokens_per_s
            row.reported_at = now

    def of_model(self, model: str) -> list[EngineSpeed]:
        with self._transaction() as session:
            rows = session.scalars(select(EngineSpeedRow).where(EngineSpeedRow.model == model))
            return [
                EngineSpeed(
                    worker=row.worker,
                    model=row.model,
                    runner=row.runner,
                    tokens_per_s=row.tokens_per_s,
                    output_fraction=row.output_fraction,
                    step_s=row.step_s,
                    interactive_tokens_per_s=row.interactive_tokens_per_s,
                    reported_at=as_utc(row.reported_at),
                    at_load=row.at_load,
                )
                for row in rows
            ]

    def forget_gone(self, *, after_s: int) -> int:
        """Delete the rows of workers silent for `after_s`, but the newest of each model
        (it stands in while none is live). Returns how many went."""
        cutoff = self._clock() - timedelta(seconds=after_s)
        newest = (
            select(EngineSpeedRow.model, func.max(EngineSpeedRow.reported_at).label("at"))
            .group_by(EngineSpeedRow.model)
            .subquery()
        )
        with self._transaction() as session:
            keep = select(EngineSpeedRow.worker).join(
                newest,
                (newest.c.model == EngineSpeedRow.model)
                & (newest.c.at == EngineSpeedRow.reported_at),
            )
            result = session.execute(
                delete(EngineSpeedRow)
                .where(EngineSpeedRow.reported_at < cutoff, EngineSpeedRow.worker.not_in(keep))
                .execution_options(synchronize_session=False)
            )
            return int(getattr(result, "rowcount", 0) or 0)
