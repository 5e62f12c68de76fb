"""The pipeline-only engine: built only when settings allow it, answering with placeholders."""

from __future__ import annotations

from inferq.domain.jobs import SamplingParams
from inferq.settings import Settings
from worker.engine.factory import build_engine
from worker.engine.pipeline_only import PipelineOnlyEngine
from worker.engine.protocol import EngineRequest


def test_it_answers_every_request_at_once_with_placeholder_tokens() -> None:
    engine = build_engine(Settings(engine="pipeline-only", allow_benchmark_engine=True))
    assert isinstance(engine, PipelineOnlyEngine)
    engine.add(
        EngineRequest(
            job_id="j", prompt_token_ids=[1, 2], sampling=SamplingParams(max_tokens=3, n=2)
        )
    )
    [finished] = engine.step()
    assert finished.job_id == "j"
    assert [c.text for c in finished.result.choices] == ["xxx", "xxx"]
    assert engine.step() == []
