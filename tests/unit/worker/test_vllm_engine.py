"""The vLLM adapter without an engine: the arguments it gives vLLM, a start it refuses
early, and its contract with the engine loop (a request vLLM cannot take is that request's
failure, never the worker's)."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from inferq.domain.jobs import SamplingParams
from inferq.exceptions import EngineStartFailed, RequestRejected
from inferq.settings import Settings
from worker.engine.protocol import EngineRequest


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
    from worker.engine.vllm.generate import VllmEngine

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


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_lora_engine_args_come_only_with_adapters() -> None:
    from worker.engine.vllm.core import engine_args

    plain = engine_args(Settings())
    assert not {"enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras"} & plain.keys()
    adapters = {"a": "/x", "b": "org/b", "c": "org/c"}
    args = engine_args(Settings(lora_adapters=adapters, max_loras=2, max_lora_rank=32))
    assert args["enable_lora"] is True
    assert args["max_loras"] == 2
    assert args["max_lora_rank"] == 32
    assert args["max_cpu_loras"] == 3  # every adapter stays in host memory


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_missing_local_adapter_fails_the_start_before_vllm_loads(tmp_path: Path) -> None:
    from worker.engine.vllm.generate import VllmEngine

    missing = tmp_path / "nowhere"
    settings = Settings(model=str(tmp_path / "no-model"), lora_adapters={"a": str(missing)})
    with pytest.raises(EngineStartFailed, match=re.escape(f"adapter 'a' is at {missing}")):
        VllmEngine.from_settings(settings)


class _NoLoras(_RefusingCore):
    """vLLM's engine refusing to load an adapter (as it does one of too high a rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.shut_down = False
        self.engine_core = SimpleNamespace(shutdown=self._shutdown)

    def _shutdown(self) -> None:
        self.shut_down = True

    def add_lora(self, _: Any) -> bool:
        raise RuntimeError("Call to add_lora method failed: LoRA rank 32 is greater than 16.")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_an_adapter_vllm_cannot_load_fails_the_start_and_closes_the_engine() -> None:
    from worker.engine.vllm.generate import VllmEngine

    core = _NoLoras()
    engine = VllmEngine(
        SimpleNamespace(llm_engine=core),  # type: ignore[arg-type]
        step_timeout_s=60,
        adapters={"big": "/adapters/big"},
    )
    with pytest.raises(EngineStartFailed, match=r"adapter 'big' from /adapters/big: .*rank 32"):
        engine.load_adapters()
    assert core.shut_down
