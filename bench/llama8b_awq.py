"""A stand-in for Llama-3.1-8B-Instruct-AWQ-INT4 for benchmarks on a GPU host without
network: the exact shapes, in AutoAWQ's GEMM INT4 format, with random weights and a
synthetic word-level tokenizer of the same vocabulary size (128,256).

The kernels and memory traffic are those of the real model; the text is noise, and
`ignore_eos` makes every output as long as asked. NOT a language model.

    python -m bench.llama8b_awq /data/llama-3.1-8b-awq-random      # about 5.7 GB
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

HIDDEN = 4096
INTERMEDIATE = 14336
LAYERS = 32
HEADS = 32
KV_HEADS = 8
HEAD_DIM = 128
VOCAB = 128_256
GROUP = 128
PACK = 8  # 4-bit values per int32
SPECIAL = {
    "<|begin_of_text|>": 128_000,
    "<|end_of_text|>": 128_001,
    "<|start_header_id|>": 128_006,
    "<|end_header_id|>": 128_007,
    "<|eot_id|>": 128_009,
}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def config(shape: dict[str, int]) -> dict[str, object]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape["hidden"],
        "intermediate_size": shape["intermediate"],
        "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"],
        "num_key_value_heads": shape["kv_heads"],
        "head_dim": shape["head_dim"],
        "vocab_size": shape["vocab"],
        "max_position_embeddings": 131_072,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500_000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": SPECIAL["<|begin_of_text|>"],
        "eos_token_id": [SPECIAL["<|end_of_text|>"], SPECIAL["<|eot_id|>"]],
        "torch_dtype": "float16",
        "quantization_config": {
            "quant_method": "awq",
            "bits": 4,
            "group_size": GROUP,
            "zero_point": True,
            "version": "gemm",
        },
    }


def _awq_linear(rng: np.random.Generator, prefix: str, k: int, n: int) -> dict[str, np.ndarray]:
    """AutoAWQ GEMM layout: qweight [k, n/8], qzeros [k/128, n/8], scales [k/128, n]."""
    return {
        f"{prefix}.qweight": rng.integers(-(2**31), 2**31, size=(k, n // PACK), dtype=np.int32),
        # Every zero point 8, the middle of 0..15: weights centred on zero.
        f"{prefix}.qzeros": np.full((k // GROUP, n // PACK), 0x88888888 - 2**32, dtype=np.int32),
        f"{prefix}.scales": (rng.random((k // GROUP, n), dtype=np.float32) * 0.004 + 0.001).astype(
            np.float16
        ),
    }


def write_weights(path: Path, shape: dict[str, int], seed: int) -> None:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    h, i, v = shape["hidden"], shape["intermediate"], shape["vocab"]
    q_out, kv_out = shape["heads"] * shape["head_dim"], shape["kv_heads"] * shape["head_dim"]
    index: dict[str, str] = {}

    def shard(name: str, tensors: dict[str, np.ndarray]) -> None:
        save_file(tensors, str(path / name), metadata={"format": "pt"})
        index.update(dict.fromkeys(tensors, name))

    def dense(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    shard("embed.safetensors", {"model.embed_tokens.weight": dense(v, h)})
    for layer in range(shape["layers"]):
        p = f"model.layers.{layer}"
        tensors = {
            f"{p}.input_layernorm.weight": np.ones(h, dtype=np.float16),
            f"{p}.post_attention_layernorm.weight": np.ones(h, dtype=np.float16),
        }
        for name, k, n in (
            ("self_attn.q_proj", h, q_out),
            ("self_attn.k_proj", h, kv_out),
            ("self_attn.v_proj", h, kv_out),
            ("self_attn.o_proj", q_out, h),
            ("mlp.gate_proj", h, i),
            ("mlp.up_proj", h, i),
            ("mlp.down_proj", i, h),
        ):
            tensors.update(_awq_linear(rng, f"{p}.{name}", k, n))
        shard(f"layer-{layer:02d}.safetensors", tensors)
    shard(
        "head.safetensors",
        {"model.norm.weight": np.ones(h, dtype=np.float16), "lm_head.weight": dense(v, h)},
    )
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": index}, indent=1)
    )


def write_tokenizer(path: Path, vocab_size: int) -> None:
    """Word-level: token n is the word `t<n>`; Llama 3's special tokens at their ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {f"t{n}": n for n in range(vocab_size)}
    for text, token_id in SPECIAL.items():
        words.pop(f"t{token_id}", None)
        words[text] = token_id
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="t0"))  # noqa: S106 - a token
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, SPECIAL[bos])]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token="<|eot_id|>",  # noqa: S106 - a token, not a password
        pad_token="<|end_of_text|>",  # noqa: S106
        additional_special_tokens=[t for t in SPECIAL if t not in (bos,)],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)


def build(path: Path, *, shape: dict[str, int], seed: int = 0) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config(shape), indent=2))
    write_tokenizer(path, shape["vocab"])
    write_weights(path, shape, seed)
    (path / "RANDOM-WEIGHTS-NOT-A-MODEL.txt").write_text(__doc__ or "")
    return path


LLAMA_31_8B = {
    "hidden": HIDDEN,
    "intermediate": INTERMEDIATE,
    "layers": LAYERS,
    "heads": HEADS,
    "kv_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "vocab": VOCAB,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("path", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.path, shape=LLAMA_31_8B, seed=args.seed))


if __name__ == "__main__":
    main()
