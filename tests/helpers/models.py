"""Registering a model as its worker would, for deployments whose worker is not running."""

from __future__ import annotations

from pathlib import Path

from inferq.domain.served_models import served_by
from inferq.settings import Settings
from inferq.store.database import make_database, make_sessions
from inferq.store.served_models import ModelStore


def register_model(database_url: str, model: Path, *, name: str = "tiny") -> None:
    """Record `model` as served under `name`: the API then accepts its jobs, which wait in
    its queues for a worker."""
    engine = make_database(database_url, pool_size=1)
    try:
        settings = Settings(model=str(model), served_model_name=name)
        ModelStore(make_sessions(engine)).register(served_by(settings))
    finally:
        engine.dispose()
