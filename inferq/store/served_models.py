"""The served models the GPU workers registered (inferq/domain/served_models.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from sqlalchemy import delete, select

from inferq.domain.served_models import ServedModel
from inferq.store.base import Store, utcnow
from inferq.store.dialects import conflict_insert
from inferq.store.models import ServedModelRow


class ModelStore(Store):
    def register(self, models: Sequence[ServedModel]) -> None:
        """Record what a worker serves: its model and adapters, replacing what an earlier
        worker of the same model said (an adapter it no longer serves is forgotten)."""
        if not models:
            return
        bases = {model.base for model in models}
        now = utcnow()
        with self._transaction() as session:
            # Rows of these bases that are not among `models` go: adapters removed since.
            names = [model.name for model in models]
            session.execute(
                delete(ServedModelRow).where(
                    ServedModelRow.base.in_(bases), ServedModelRow.name.not_in(names)
                )
            )
            for model in models:
                session.merge(_row(model, now))

    def announce(self, models: Sequence[ServedModel]) -> list[str]:
        """Record names a starting worker will serve, before its engine has loaded, so the
        API accepts (and queues) their work from then on; a name already registered keeps
        what its last loaded worker said. Returns the names that were new."""
        if not models:
            return []
        now = utcnow()
        with self._transaction() as session:
            statement = (
                conflict_insert(ServedModelRow, postgres=self._postgres)
                .values([{**asdict(model), "registered_at": now} for model in models])
                .on_conflict_do_nothing()
                .returning(ServedModelRow.name)
            )
            return sorted(session.scalars(statement))

    def all(self) -> list[ServedModel]:
        with self._reading() as session:
            rows = session.scalars(select(ServedModelRow).order_by(ServedModelRow.name))
            return [_model(row) for row in rows]


def _row(model: ServedModel, now: object) -> ServedModelRow:
    return ServedModelRow(**asdict(model), registered_at=now)


def _model(row: ServedModelRow) -> ServedModel:
    return ServedModel(
        name=row.name,
        base=row.base,
        runner="pooling" if row.runner == "pooling" else "generate",
        tokenizer=row.tokenizer,
        max_model_len=row.max_model_len,
        chat_template=row.chat_template,
        tool_call_parser=row.tool_call_parser,
        adapter=row.adapter,
        embedding_size=row.embedding_size,
        supports_dimensions=row.supports_dimensions,
    )
