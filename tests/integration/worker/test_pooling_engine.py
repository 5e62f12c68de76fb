"""The embeddings engine: vLLM's pooling runner behind the `Engine` interface, on the tiny
model on the CPU (one engine for the module: a start costs ~20 s)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from cli.demo_model import CPU_DTYPE
from inferq.domain.jobs import JobResult, SamplingParams
from inferq.exceptions import RequestRejected
from inferq.settings import Settings
from inferq.wire.prompts import PromptRenderer
from worker.engine.protocol import EngineRequest

if TYPE_CHECKING:
    from worker.engine.vllm.pooling import VllmPoolingEngine

# Importing vLLM (and torch) warns of their own deprecations.
pytestmark = [
    pytest.mark.engine,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.xdist_group("pooling_engine"),
]

TEXTS = ("The cat sat on the mat.", "Queues keep the engine full.", "A third, longer sentence.")


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Iterator[VllmPoolingEngine]:
    from worker.engine.factory import build_engine
    from worker.engine.vllm.pooling import VllmPoolingEngine

    settings = Settings(
        model=str(tiny_model),
        runner="pooling",
        dtype=CPU_DTYPE,
        enforce_eager=True,
        max_num_seqs=16,
        # A size, not a fraction of a NUMA node, so it starts whatever the host's layout.
        kv_cache_memory_bytes=64 << 20,  # type: ignore[arg-type]
    )
    built = build_engine(settings)
    assert isinstance(built, VllmPoolingEngine)
    yield built
    built.close()


@pytest.fixture(scope="module")
def inputs(renderer: PromptRenderer) -> list[list[int]]:
    return renderer.encode_many(TEXTS, add_special_tokens=True)


def _request(job_id: str, inputs: Sequence[list[int]], **pooling: Any) -> EngineRequest:
    return EngineRequest(
        job_id=job_id,
        prompt_token_ids=[token for ids in inputs for token in ids],
        sampling=SamplingParams(
            max_tokens=1,
            pooling={
                "input_lengths": [len(ids) for ids in inputs],
                "dimensions": None,
                "encoding_format": "float",
                **pooling,
            },
        ),
    )


def _run(engine: VllmPoolingEngine, *requests: EngineRequest) -> dict[str, JobResult]:
    for request in requests:
        engine.add(request)
    results: dict[str, JobResult] = {}
    deadline = time.monotonic() + 60
    while len(results) < len(requests):
        assert time.monotonic() < deadline, f"only {sorted(results)} finished"
        results.update((f.job_id, f.result) for f in engine.step())
    return results


def _vectors(engine: VllmPoolingEngine, result: JobResult) -> np.ndarray[Any, Any]:
    assert result.embedding is not None
    return np.frombuffer(result.embedding, dtype="<f4").reshape(-1, engine.embedding_size)


def test_a_job_gets_one_unit_vector_per_input_in_input_order(
    engine: VllmPoolingEngine, inputs: list[list[int]]
) -> None:
    assert engine.embedding_size == 128  # the tiny model's hidden size
    assert engine.supports_dimensions is False
    assert engine.max_model_len == 1024
    result = _run(engine, _request("group", inputs))["group"]
    assert result.choices == ()
    assert result.prompt_tokens == sum(len(ids) for ids in inputs)
    assert engine.deltas() == []
    vectors = _vectors(engine, result)
    assert vectors.shape == (3, 128)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    # Each text's vector is its own, whether it came alone or in the group.
    for i, ids in enumerate(inputs):
        alone = _vectors(engine, _run(engine, _request(f"alone-{i}", [ids]))[f"alone-{i}"])
        np.testing.assert_allclose(alone[0], vectors[i], atol=1e-5)
    assert not np.allclose(vectors[0], vectors[1], atol=1e-3)
    assert not np.allclose(vectors[1], vectors[2], atol=1e-3)


def test_jobs_in_flight_together_each_get_their_own_vectors(
    engine: VllmPoolingEngine, inputs: list[list[int]]
) -> None:
    expected = _vectors(engine, _run(engine, _request("reference", inputs))["reference"])
    results = _run(
        engine,
        _request("first", inputs[:2]),
        _request("second", [inputs[2], inputs[0]]),
    )
    np.testing.assert_allclose(_vectors(engine, results["first"]), expected[:2], atol=1e-5)
    np.testing.assert_allclose(_vectors(engine, results["second"]), expected[[2, 0]], atol=1e-5)


def test_dimensions_on_a_model_without_matryoshka_is_rejected(
    engine: VllmPoolingEngine, inputs: list[list[int]]
) -> None:
    with pytest.raises(
        RequestRejected, match=r"does not support Matryoshka.*dimensions must be unset"
    ):
        engine.add(_request("cut", inputs, dimensions=8))
    # Nothing of it stayed in the engine: the next job runs alone and finishes.
    assert set(_run(engine, _request("after", inputs[:1]))) == {"after"}


def test_an_aborted_job_produces_nothing(
    engine: VllmPoolingEngine, inputs: list[list[int]]
) -> None:
    engine.add(_request("dropped", inputs))
    engine.abort(["dropped"])
    assert set(_run(engine, _request("kept", inputs))) == {"kept"}
    # Its inputs are gone from vLLM too, not merely ignored here.
    assert not engine._engine.has_unfinished_requests()
