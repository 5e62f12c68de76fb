"""Which engine a worker runs: the one place that names the implementations of
`worker.engine.protocol.Engine`, so the interface imports none of them."""

from __future__ import annotations

from inferq.settings import EngineSettings
from worker.engine.protocol import Engine


def build_engine(settings: EngineSettings) -> Engine:
    """Build the configured engine. This is where the model is loaded: slow, done once.
    `settings` come from `inferq.host.preflight.engine_settings` (the KV cache sized); a failed
    start raises `EngineStartFailed`, which says why in one line."""
    # Imported here: vLLM is heavy, and the benchmark engines' users never need it.
    if settings.engine == "pipeline-only":
        from worker.engine.pipeline_only import PipelineOnlyEngine

        return PipelineOnlyEngine()
    if settings.engine == "paced":
        from worker.engine.paced import PacedEngine, StepTimes

        assert settings.paced_engine_table is not None  # the settings' check
        return PacedEngine(
            times=StepTimes.load(settings.paced_engine_table),
            max_num_seqs=settings.engine_max_num_seqs,
        )
    if settings.runner == "pooling":
        from worker.engine.vllm.pooling import VllmPoolingEngine

        return VllmPoolingEngine.from_settings(settings)
    from worker.engine.vllm.generate import VllmEngine

    return VllmEngine.from_settings(settings)
