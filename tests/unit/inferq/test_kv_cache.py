"""KV-cache sizing for memory shapes this machine does not have: 1, 4, 8 and 64 GiB NUMA
nodes on a CPU, and GPUs of several sizes."""

from __future__ import annotations

import pytest

from inferq.host.kv_cache import (
    CPU_ENGINE_OVERHEAD_BYTES,
    Device,
    GiB,
    KvCachePlan,
    Memory,
    MiB,
    ModelShape,
    NotEnoughMemory,
    plan_kv_cache,
    sequence_bytes,
)

# The tests' tiny model in float32: 2 layers, 2 KV heads of 64: 2 KiB a token.
TINY = ModelShape(
    num_layers=2,
    num_kv_heads=2,
    head_dim=64,
    context_len=1024,
    kv_dtype_bytes=4,
    weights_bytes=4 * MiB,
)
# Llama 3.1 8B in AWQ INT4: 32 layers, 8 KV heads of 128 in bf16: 128 KiB a token.
LLAMA_8B_AWQ = ModelShape(
    num_layers=32,
    num_kv_heads=8,
    head_dim=128,
    context_len=131072,
    kv_dtype_bytes=2,
    weights_bytes=int(5.4 * GiB),
)


def node(total_gib: float, free_gib: float) -> Memory:
    return Memory(
        where="NUMA node 0", total_bytes=int(total_gib * GiB), available_bytes=int(free_gib * GiB)
    )


def gpu(total_gib: float, free_gib: float) -> Memory:
    return Memory(
        where="GPU 0 (test)", total_bytes=int(total_gib * GiB), available_bytes=int(free_gib * GiB)
    )


def plan(
    memory: Memory,
    *,
    shape: ModelShape = TINY,
    device: Device = "cpu",
    max_num_seqs: int = 16,
    max_model_len: int | None = None,
    explicit: int | None = None,
    utilization: float = 0.9,
) -> KvCachePlan:
    return plan_kv_cache(
        shape=shape,
        device=device,
        memory=memory,
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        explicit_bytes=explicit,
        gpu_memory_utilization=utilization,
    )


def test_a_token_costs_keys_and_values_of_every_layer() -> None:
    assert TINY.kv_bytes_per_token == 2 * 2 * 2 * 64 * 4 == 2048
    assert LLAMA_8B_AWQ.kv_bytes_per_token == 128 * 1024
    # Counted at whole blocks: 1,000 tokens take what 1,024 do.
    assert sequence_bytes(TINY, 1000) == sequence_bytes(TINY, 1024) == 2 * MiB


@pytest.mark.parametrize(("total_gib", "free_gib"), [(4, 3.5), (8, 6.2), (64, 60)])
def test_on_a_cpu_the_tests_get_what_their_sequences_need_on_any_node(
    total_gib: float, free_gib: float
) -> None:
    # 16 sequences of 1,024 tokens: 32 MiB, whatever the node; a fraction of the node
    # (the old 0.08) was less than nothing on the 8 GiB one.
    result = plan(node(total_gib, free_gib))
    assert result.kv_cache_bytes == 16 * 1024 * 2048
    assert "16 sequences of 1024 tokens" in result.how


def test_on_a_cpu_the_cache_is_capped_at_half_of_what_is_free() -> None:
    # 256 sequences of 2,048 tokens at 4 KiB a token would need 2 GiB.
    bench = ModelShape(
        num_layers=4,
        num_kv_heads=2,
        head_dim=64,
        context_len=2048,
        kv_dtype_bytes=4,
        weights_bytes=40 * MiB,
    )
    roomy = plan(node(8, 6.2), shape=bench, max_num_seqs=256)
    assert roomy.kv_cache_bytes == 2 * GiB

    tight = plan(node(4, 3.5), shape=bench, max_num_seqs=256)
    expected = (int(3.5 * GiB) - 40 * MiB - CPU_ENGINE_OVERHEAD_BYTES) // 2
    assert tight.kv_cache_bytes == expected
    assert tight.kv_cache_bytes is not None
    assert sequence_bytes(bench, 2048) <= tight.kv_cache_bytes < 2 * GiB
    assert "would need 2.00 GiB" in tight.how


def test_a_1_gib_node_cannot_hold_the_engine_and_says_so() -> None:
    with pytest.raises(NotEnoughMemory, match=r"NUMA node 0 has 0\.80 GiB free of 1\.00 GiB"):
        plan(node(1, 0.8))


def test_a_context_too_long_for_the_node_names_max_model_len() -> None:
    # One 131,072-token sequence of the 8B model is 16 GiB: more than half of a 64 GiB
    # node's free memory after the weights.
    with pytest.raises(NotEnoughMemory, match="lower INFERQ_MAX_MODEL_LEN"):
        plan(node(64, 30), shape=LLAMA_8B_AWQ)
    # At 8,192 tokens it fits, capped below 256 full sequences (256 GiB).
    fits = plan(node(64, 60), shape=LLAMA_8B_AWQ, max_num_seqs=256, max_model_len=8192)
    assert fits.kv_cache_bytes is not None
    assert sequence_bytes(LLAMA_8B_AWQ, 8192) <= fits.kv_cache_bytes <= 30 * GiB


def test_weights_larger_than_the_node_ask_for_a_smaller_model() -> None:
    with pytest.raises(NotEnoughMemory, match="use a smaller model"):
        plan(node(4, 3.5), shape=LLAMA_8B_AWQ, max_model_len=8192)


def test_an_explicit_size_is_used_when_it_fits() -> None:
    result = plan(node(8, 6.2), explicit=256 * MiB)
    assert result.kv_cache_bytes == 256 * MiB
    assert "INFERQ_KV_CACHE_MEMORY_BYTES" in result.how


def test_an_explicit_size_too_small_for_one_sequence_says_how_small_it_may_be() -> None:
    with pytest.raises(NotEnoughMemory, match=r"raise it to at least 2097152"):
        plan(node(8, 6.2), explicit=1 * MiB)


def test_an_explicit_size_larger_than_the_node_says_how_large_it_may_be() -> None:
    with pytest.raises(NotEnoughMemory, match=r"lower it to at most \d+") as caught:
        plan(node(8, 6.2), explicit=16 * GiB)
    assert "INFERQ_KV_CACHE_MEMORY_BYTES asks for 16.00 GiB" in caught.value.message


def test_on_a_gpu_vllm_profiles_what_gpu_memory_utilization_leaves() -> None:
    result = plan(gpu(24, 23.5), shape=LLAMA_8B_AWQ, device="cuda", max_num_seqs=256)
    assert result.kv_cache_bytes is None
    assert "21.60 GiB of GPU 0 (test)" in result.how


def test_on_a_gpu_weights_that_do_not_fit_suggest_tensor_parallelism() -> None:
    with pytest.raises(NotEnoughMemory, match="INFERQ_TENSOR_PARALLEL_SIZE"):
        plan(gpu(4, 4), shape=LLAMA_8B_AWQ, device="cuda")


def test_on_a_busy_gpu_the_message_gives_the_utilization_that_would_fit() -> None:
    with pytest.raises(NotEnoughMemory, match=r"lower it to at most 0\.42"):
        plan(gpu(24, 10), shape=LLAMA_8B_AWQ, device="cuda")


def test_on_a_gpu_an_explicit_size_must_fit_beside_the_weights() -> None:
    assert plan(gpu(80, 79), shape=LLAMA_8B_AWQ, device="cuda", explicit=20 * GiB).kv_cache_bytes
    with pytest.raises(NotEnoughMemory, match="lower it to at most"):
        plan(gpu(24, 23.5), shape=LLAMA_8B_AWQ, device="cuda", explicit=20 * GiB)
