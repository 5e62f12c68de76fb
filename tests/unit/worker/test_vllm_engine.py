"""The vLLM adapter's contract with the engine loop: a request vLLM cannot take is that
request's failure, never the worker's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from inferq.exceptions import RequestRejected
from inferq.jobs import SamplingParams
from worker.engine import EngineRequest


class _RefusingCore:
    """vLLM's engine as seen past its front end: the request is taken there, then cannot be
    encoded for the engine core (as a number above 2**64 cannot)."""

    def __init__(self) -> None:
        self.aborted: list[str] = []
        self.engine_core = SimpleNamespace(shutdown=lambda: None)

    def add_request(self, *_: Any, **__: Any) -> None:
        raise OverflowError("int too big to convert")

    def abort_request(self, request_ids: list[str]) -> None:
        self.aborted.extend(request_ids)


# Importing vLLM (and torch) warns of their own deprecations.
@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_request_the_engine_core_cannot_take_is_rejected_and_forgotten() -> None:
    from worker.vllm_engine import VllmEngine

    core = _RefusingCore()
    engine = VllmEngine(SimpleNamespace(llm_engine=core), step_timeout_s=60)  # type: ignore[arg-type]
    try:
        with pytest.raises(RequestRejected, match="int too big"):
            engine.add(
                EngineRequest(
                    job_id="job_1", prompt_token_ids=[1, 2], sampling=SamplingParams(max_tokens=2)
                )
            )
    finally:
        engine.close()
    assert core.aborted == ["job_1"]
