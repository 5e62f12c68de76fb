"""The same requests to `vllm serve` and to inferq, side by side: every shape in
`bench/compat_shapes.py` (OpenAI's optional fields, vLLM's extra fields, other vendors'
fields, completions prompts as lists and token ids, echo, the chat template's options,
tools, structured output, streaming, the Responses API), sent to each on the tiny model
with the same engine settings, one at a time. Each shape's status from both, and the
error inferq gave where it gave one.

    python -m bench.compat [--out bench/results/compat.json]

The check fails (exit status 1) where serve answers a shape 2xx and inferq does not, or
where inferq answers any shape with a 5xx. The shapes that ask what a text model cannot do
(`ordinary=False`: an image part, audio out) pass when inferq refuses them with a 4xx, as
documented, whatever serve does. A streamed answer counts by its HTTP status; an error
event in its stream is recorded beside it. serve is started with the tool-call options
(`--enable-auto-tool-choice --tool-call-parser llama3_json`) without which it refuses any
`tool_choice`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx

from bench import stack
from bench.compare import inferq_env
from bench.compat_shapes import SHAPES, Shape
from bench.peers import SERVED, served
from cli.demo_model import CPU_DTYPE, TINY

# The tests' engine settings (tests/conftest.py), the same for both systems.
MAX_NUM_SEQS = 16
KV_CACHE_BYTES = 256 * 2**20


def engine_args(model: Path) -> dict[str, Any]:
    return {
        "model": str(model),
        "served_model_name": SERVED,
        "max_model_len": TINY.max_position_embeddings,
        "max_num_seqs": MAX_NUM_SEQS,
        "kv_cache_memory_bytes": KV_CACHE_BYTES,
        "enforce_eager": True,
        "dtype": CPU_DTYPE,
        "seed": 0,
    }


# What serve needs to take `tools` with a `tool_choice` at all (inferq needs nothing): the
# tiny model's chat template is Llama 3's.
SERVE_TOOLS = {"enable_auto_tool_choice": True, "tool_call_parser": "llama3_json"}


def send(client: httpx.Client, shape: Shape) -> dict[str, Any]:
    """One shape's answer: its status, and what went wrong where something did."""
    answer = client.post(shape.path, json={"model": SERVED, **shape.body})
    seen: dict[str, Any] = {"status": answer.status_code}
    if answer.is_success and shape.streamed and (error := _first_error(answer.text)):
        seen["stream_error"] = error
    elif not answer.is_success:
        seen["error"] = answer.text[:300]
    return seen


def _first_error(stream: str) -> str | None:
    """The first event of `stream` that is an error (an `error` object, or an event of
    type `error`), if there is one."""
    for line in stream.splitlines():
        if _ERROR_EVENT.search(line):
            return line[:300]
    return None


_ERROR_EVENT = re.compile(r'^event: error|"error":\s*\{|"type":\s*"error"')


def verdict(shape: Shape, serve: dict[str, Any], inferq: dict[str, Any]) -> str:
    """`ok`, `refused as documented` (a shape inferq refuses on purpose, with a 4xx), or
    why the shape fails the check."""
    if inferq["status"] >= 500:
        return "inferq 5xx"
    if not shape.ordinary and 400 <= inferq["status"] < 500:
        return "refused as documented"
    if 200 <= serve["status"] < 300 and not 200 <= inferq["status"] < 300:
        return "serve answers, inferq does not"
    return "ok"


def compare(serve_url: str, inferq_url: str) -> list[dict[str, Any]]:
    rows = []
    with (
        httpx.Client(base_url=serve_url, timeout=300) as serve,
        httpx.Client(
            base_url=inferq_url,
            timeout=300,
            headers={"Authorization": f"Bearer {stack.ADMIN_KEY}"},
        ) as inferq,
    ):
        for shape in SHAPES:
            theirs, ours = send(serve, shape), send(inferq, shape)
            row = {
                "shape": shape.name,
                "group": shape.group,
                "path": shape.path,
                "ordinary": shape.ordinary,
                "serve": theirs,
                "inferq": ours,
                "verdict": verdict(shape, theirs, ours),
            }
            rows.append(row)
            print(
                f"{shape.path:22} {shape.name:34} serve {theirs['status']} "
                f"inferq {ours['status']} {row['verdict']}",
                flush=True,
            )
    return rows


_PASSING = ("ok", "refused as documented")


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The counts: of the ordinary shapes, those serve answers and how many of those inferq
    answers too; inferq's 5xx over every shape; which shapes fail the check."""
    answered = [r for r in rows if r["ordinary"] and 200 <= r["serve"]["status"] < 300]
    return {
        "shapes": len(rows),
        "ordinary": sum(r["ordinary"] for r in rows),
        "serve_answers": len(answered),
        "inferq_answers_of_those": sum(200 <= r["inferq"]["status"] < 300 for r in answered),
        "inferq_5xx": sum(r["inferq"]["status"] >= 500 for r in rows),
        "refused_as_documented": [
            r["shape"] for r in rows if r["verdict"] == "refused as documented"
        ],
        "failing": [r["shape"] for r in rows if r["verdict"] not in _PASSING],
    }


def run() -> dict[str, Any]:
    model = stack.demo_model()
    args = engine_args(model)
    with tempfile.TemporaryDirectory() as work:
        workdir = Path(work)
        with (
            served(args | SERVE_TOOLS, workdir) as (_, serve_url),
            stack.deployment(model, workdir, **inferq_env(args)) as running,
        ):
            rows = compare(serve_url, running.url)
    return {
        "engine": {k: v for k, v in args.items() if k != "model"},
        "summary": summary(rows),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("bench/results/compat.json"))
    args = parser.parse_args()
    result = run()
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    sys.exit(1 if result["summary"]["failing"] else 0)


if __name__ == "__main__":
    main()
