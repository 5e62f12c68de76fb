"""A LoRA adapter for the tiny test model, made offline with `peft`."""

from __future__ import annotations

from pathlib import Path

# The attention projections of a Llama: every layer of vLLM's Llama takes a LoRA there.
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def make_tiny_adapter(model_dir: Path, out_dir: Path, *, rank: int = 8, seed: int = 0) -> Path:
    """Save a random rank-`rank` LoRA adapter of the model at `model_dir` in `out_dir`.

    Unlike a fresh adapter (whose B is zero), this one changes the model's output: greedy
    text from it differs from the base model's.
    """
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    base = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank,
        # alpha / r scales the update: twice its weights, to outweigh the base's small ones.
        lora_alpha=2 * rank,
        target_modules=list(ATTENTION_PROJECTIONS),
        init_lora_weights=False,
        lora_dropout=0.0,
        bias="none",
    )
    model = get_peft_model(base, config)
    model.save_pretrained(str(out_dir))
    return out_dir
