"""An embeddings batch: inferq's `/v1/batches` with a pooling worker against `vllm
run-batch` on the same file, model and engine settings, in one run.

    python -m bench.embeddings                     # 20,000 lines
    python -m bench.embeddings --lines 500 --out bench/results

Every line embeds one text of about 20 to 200 tokens (log-normal, random tokens decoded
to text). Both systems run the model through vLLM's pooling runner (a `*ForCausalLM`
converted to embeddings: the last token's hidden state, normalised). run-batch's time is
its processing: its wall time less its engine's load (`bench.run_batch` notes when that
ends). Embeddings generate nothing: the rates are inputs/s and prompt tokens/s (from each
output's `usage`). Checks that every line has a vector in both outputs and that the two
systems' vectors for a line agree (cosine above 0.999). Writes `embeddings.json` to --out.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
from pathlib import Path
from typing import Any, Final

import numpy as np

from bench import stack, workload
from bench.compare import engine_args, inferq, inferq_env, run_inferq_batch
from bench.peers import SERVED, run_run_batch
from cli.demo_model import BENCH

EMBEDDINGS_URL: Final = "/v1/embeddings"
# Short to medium texts, in tokens of the model's own tokenizer.
TEXT_MEDIAN, TEXT_SIGMA, TEXT_RANGE = 64, 0.6, (20, 200)
MIN_COSINE = 0.999
# What inferq's pooling worker gives vLLM (worker.engine.vllm.pooling.POOLING_ARGS), and the
# prefix caching inferq turns on (INFERQ_ENABLE_PREFIX_CACHING, true by default).
POOLING_FLAGS = {"runner": "pooling", "convert": "embed", "enable_prefix_caching": True}


def texts(tokenizer: Any, count: int, *, seed: int = workload.SEED) -> list[str]:
    """`count` texts of random tokens decoded, each about a drawn number of tokens long."""
    rng = random.Random(seed)
    specials = set(tokenizer.all_special_ids)
    # Leave out tokens that decode to NUL: Postgres text cannot hold it, so inferq refuses it.
    vocab = [
        i
        for i in range(tokenizer.vocab_size)
        if i not in specials and "\x00" not in tokenizer.decode([i])
    ]
    low, high = TEXT_RANGE
    out = []
    for _ in range(count):
        length = max(low, min(high, round(rng.lognormvariate(0, TEXT_SIGMA) * TEXT_MEDIAN)))
        text = tokenizer.decode([rng.choice(vocab) for _ in range(length)])
        # Decoded random tokens tokenize again into more tokens: cut to the drawn length.
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
        out.append(tokenizer.decode(ids))
    return out


def write_file(inputs: list[str], path: Path) -> Path:
    with path.open("w") as out:
        for i, text in enumerate(inputs):
            line = {"custom_id": f"e{i}", "method": "POST", "url": EMBEDDINGS_URL}
            out.write(json.dumps({**line, "body": {"model": SERVED, "input": text}}) + "\n")
    return path


def vectors(outputs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Each line's vector by custom_id; a line without one is left out."""
    found = {}
    for line in outputs:
        try:
            embedding = line["response"]["body"]["data"][0]["embedding"]
        except (TypeError, KeyError, IndexError):
            continue
        found[line["custom_id"]] = np.asarray(embedding, dtype=np.float32)
    return found


def figures(result: dict[str, Any], found: dict[str, np.ndarray]) -> dict[str, Any]:
    """`peers.throughput`'s figures named for embeddings (its tokens are prompt tokens)."""
    seconds = result["seconds"]
    return {
        "seconds": seconds,
        "inputs": result["requests"],
        "inputs_per_s": result["requests_per_s"],
        "prompt_tokens": result["generated_tokens"],
        "prompt_tokens_per_s": result["tokens_per_s"],
        "vectors": len(found),
        **{k: result[k] for k in ("wall_s", "start_up_s") if k in result},
    }


def agreement(ours: dict[str, np.ndarray], theirs: dict[str, np.ndarray]) -> dict[str, Any]:
    """The cosine of the two systems' vectors for each custom_id both have."""
    common = sorted(ours.keys() & theirs.keys())
    if not common:
        return {"compared": 0}
    a = np.stack([ours[k] for k in common])
    b = np.stack([theirs[k] for k in common])
    if a.shape != b.shape:
        return {"compared": len(common), "error": f"vector shapes {a.shape} and {b.shape}"}
    cosine = (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {
        "compared": len(common),
        "min_cosine": float(cosine.min()),
        "below_min": int((cosine <= MIN_COSINE).sum()),
    }


def run_batch_processing(
    file: Path, engine: dict[str, Any], workdir: Path
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """run-batch's figures over its processing (its wall time less its engine's load), and
    its vectors."""
    result = run_run_batch(file, engine, workdir, usage_field="prompt_tokens")
    start_up = result["load_s"]
    with (workdir / "run-batch.out.jsonl").open() as f:
        found = vectors([json.loads(x) for x in f])
    return figures({**result, "start_up_s": start_up}, found), found


def inferq_processing(
    file: Path, model: Path, engine: dict[str, Any], workdir: Path
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """inferq's figures, from upload to the output file read, and its vectors."""
    with inferq(model, workdir, **inferq_env(engine), INFERQ_RUNNER="pooling") as url:
        result = run_inferq_batch(
            url, file, keep_outputs=True, endpoint=EMBEDDINGS_URL, usage_field="prompt_tokens"
        )
    found = vectors(result.pop("outputs"))
    return figures(result, found), found


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--model", type=Path, default=None, help="default: the bench model")
    parser.add_argument("--gpu", action="store_true", help="the GPU reference settings")
    parser.add_argument("--skip", default="", help="run-batch and/or inferq")
    return parser.parse_args()


def _print(results: dict[str, Any]) -> None:
    for name in ("run-batch", "inferq"):
        if name in results:
            r = results[name]
            print(
                f"{name:10} {r['inputs_per_s']:8.1f} inputs/s {r['prompt_tokens_per_s']:9.0f} "
                f"prompt tok/s  {r['vectors']}/{results['lines']} lines with a vector"
            )
    if "agreement" in results:
        a = results["agreement"]
        print(
            f"vectors compared: {a['compared']}, {a.get('below_min')} with cosine <= {MIN_COSINE}"
        )
    if "ratio" in results:
        print(f"inferq / run-batch: {results['ratio']:.3f} (target >= 1.0)")


def main() -> None:
    args = _parse()
    skip = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    model = args.model or stack.demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=args.gpu) | POOLING_FLAGS
    workdir = args.out / "work-embeddings"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    file = write_file(texts(AutoTokenizer.from_pretrained(model), args.lines), workdir / "in.jsonl")
    results: dict[str, Any] = {"lines": args.lines}
    found: dict[str, dict[str, np.ndarray]] = {}
    if "run-batch" not in skip:
        results["run-batch"], found["run-batch"] = run_batch_processing(file, engine, workdir)
    if "inferq" not in skip:
        results["inferq"], found["inferq"] = inferq_processing(file, model, engine, workdir)
    if len(found) == 2:
        results["agreement"] = agreement(found["inferq"], found["run-batch"])
        results["ratio"] = results["inferq"]["inputs_per_s"] / results["run-batch"]["inputs_per_s"]
    (args.out / "embeddings.json").write_text(json.dumps(results, indent=2) + "\n")
    _print(results)


if __name__ == "__main__":
    main()
