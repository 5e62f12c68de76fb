"""Which engine a worker runs: the one place that names the implementations of
`worker.engine.protocol.Engine`, so the interface imports none of them."""

from __future__ import annotations

from inferq.settings import Settings
from worker.engine.protocol import Engine


def build_engine(settings: Settings) -> Engine:
    """Build the configured engine. This is where the model is loaded: slow, done once.
    `settings` come from `inferq.host.preflight.engine_settings` (the KV cache sized); a failed
    start raises `EngineStartFailed`, which says why in one line."""
    # Imported here: vLLM is heavy, and the instant engine's users never need it.
    if settings.engine == "instant":
        from worker.engine.pipeline import InstantEngine

        return InstantEngine()
    if settings.runner == "pooling":
        from worker.engine.vllm.pooling import VllmPoolingEngine

        return VllmPoolingEngine.from_settings(settings)
    from worker.engine.vllm.generate import VllmEngine

    return VllmEngine.from_settings(settings)
