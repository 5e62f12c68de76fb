"""The engine limit: every prompt through one `LLM.generate` call, in a process of its own.

    python -m bench.engine_limit REQUESTS.json OUT.json ENGINE_ARGS_JSON

The prompts are rendered with the model's chat template and tokenized before the clock
starts: this is the engine alone. Writes the load time, the generation time and the
tokens generated, and the time one short request takes alone on the idle engine (the
floor for interactive latency).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

from bench.workload import chat_token_ids, load


def main() -> None:
    requests_path, out_path, engine_json = sys.argv[1:4]
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    args = json.loads(engine_json)
    requests = load(Path(requests_path))
    tokenizer = AutoTokenizer.from_pretrained(args["model"])
    prompts = [TokensPrompt(prompt_token_ids=chat_token_ids(tokenizer, r.prompt)) for r in requests]
    started = time.perf_counter()
    llm = LLM(**args)
    load_s = time.perf_counter() - started
    params = [
        SamplingParams(max_tokens=r.max_tokens, temperature=0, ignore_eos=True) for r in requests
    ]
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    generate_s = time.perf_counter() - started
    single = requests[0]
    alone = []
    for _ in range(5):
        started = time.perf_counter()
        llm.generate(
            [prompts[0]],
            SamplingParams(max_tokens=single.max_tokens, temperature=0, ignore_eos=True),
            use_tqdm=False,
        )
        alone.append(time.perf_counter() - started)
    result = {
        "load_s": load_s,
        "seconds": generate_s,
        "requests": len(requests),
        "generated_tokens": sum(len(o.outputs[0].token_ids) for o in outputs),
        "prompt_tokens": sum(len(o.prompt_token_ids or []) for o in outputs),
        "single_request_s": statistics.median(alone),
    }
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
