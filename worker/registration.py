"""What a GPU worker tells Postgres it serves: its model and the model's LoRA adapters,
with what the API needs to check requests for them (inferq/domain/served_models.py)."""

from __future__ import annotations

from inferq.domain.served_models import ServedModel, served_by
from inferq.settings import EngineSettings
from worker.engine.protocol import Engine


def served_models(settings: EngineSettings, engine: Engine) -> list[ServedModel]:
    """The model names this worker answers to, with what its engine learned while loading
    (an engine that loads no model, the pipeline-only one, knows none of it)."""
    return served_by(
        settings,
        max_model_len=getattr(engine, "max_model_len", None),
        chat_template=getattr(engine, "chat_template", None),
        embedding_size=getattr(engine, "embedding_size", None),
        supports_dimensions=bool(getattr(engine, "supports_dimensions", False)),
    )
