"""Greedy generation straight through `vllm.LLM.generate`, to compare inferq against.

Run as a script (vLLM starts its engine with spawn, so this needs a __main__ guard):
    python -m tests.helpers.reference MODEL_DIR MAX_TOKENS PROMPT...
prints a JSON list of texts.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from vllm import LLM, SamplingParams

    from cli.demo_model import CPU_DTYPE

    model, max_tokens, *prompts = sys.argv[1:]
    llm = LLM(
        model=model,
        dtype=CPU_DTYPE,  # as the tests' workers run it (tests/conftest.py)
        # 16 sequences of the tiny model's 1,024 tokens take 32 MiB; a size, not a
        # fraction of a NUMA node, so it starts whatever the host's memory layout.
        kv_cache_memory_bytes=64 << 20,
        enforce_eager=True,
        max_num_seqs=16,
    )
    params = SamplingParams(temperature=0, max_tokens=int(max_tokens))
    outputs = llm.generate(prompts, params, use_tqdm=False)
    print("REFERENCE " + json.dumps([o.outputs[0].text for o in outputs]), flush=True)


if __name__ == "__main__":
    main()
