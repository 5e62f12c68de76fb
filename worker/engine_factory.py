"""Which engine a worker runs: the one place that names the implementations of
`worker.engine.Engine`, so the interface imports none of them."""

from __future__ import annotations

from inferq.settings import Settings
from worker.engine import Engine


def build_engine(settings: Settings) -> Engine:
    """Build the configured engine. This is where the model is loaded: slow, done once.
    `settings` come from `inferq.preflight.engine_settings` (the KV cache sized); a failed
    start raises `EngineStartFailed`, which says why in one line."""
    # Imported here: vLLM is heavy, and the instant engine's users never need it.
    if settings.engine == "instant":
        from worker.instant_engine import InstantEngine

        return InstantEngine()
    if settings.runner == "pooling":
        from worker.vllm_pooling import VllmPoolingEngine

        return VllmPoolingEngine.from_settings(settings)
    from worker.vllm_engine import VllmEngine

    return VllmEngine.from_settings(settings)
