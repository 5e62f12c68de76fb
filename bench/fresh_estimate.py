"""The first batch on a freshly started deployment (issue 49): what its estimate says, as a
new user would see it, against when it really ends.

    python -m bench.fresh_estimate [--lines 20000] [--max-tokens 32]

One deployment on the tiny model (the engine settings of bench.compare); one warm-up
single job, then a batch of `--lines` lines of `--max-tokens` tokens each (the bench
workload's bodies: greedy, `ignore_eos`), read with the `openai` client every `POLL_S`
until it ends. The error of an estimate read at time t is (its end - the real end) /
(the real end - creation). Reported: the estimate at creation, when the first came, the
error at the first read with 10% of the lines done, and the largest error from then on.
The goal: none confident and wrong (no estimate is better than one far off), and within
25% from 10% of the lines on.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai

from bench import stack, workload
from bench.compare import engine_args, inferq_env
from bench.peers import SERVED

POLL_S = 1.0
GOAL = 0.25


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=Path("bench/results/fresh-estimate.json"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="fresh-estimate-"))
    model = stack.demo_model()
    # The tiny model's context is shorter than the bench model's.
    env = {**inferq_env(engine_args(model, gpu=False)), "INFERQ_MAX_MODEL_LEN": "1024"}
    with stack.deployment(model, workdir, **env) as running:
        headers = {"Authorization": f"Bearer {stack.ADMIN_KEY}"}
        warm = httpx.post(
            running.url + "/v1/jobs?wait=120",
            json={"prompt": "warm up", "max_tokens": args.max_tokens},
            headers=headers,
            timeout=180,
        )
        warm.raise_for_status()
        requests = [
            workload.Request(f"line-{i}", f"line {i}: tell me something", args.max_tokens)
            for i in range(args.lines)
        ]
        path = workload.write_batch_file(requests, SERVED, workdir / "batch.jsonl")
        client = openai.OpenAI(base_url=running.url + "/v1", api_key=stack.ADMIN_KEY, timeout=600)
        with path.open("rb") as f:
            uploaded = client.files.create(file=f, purpose="batch")
        batch = client.batches.create(
            input_file_id=uploaded.id,
            endpoint=workload.CHAT_URL,
            completion_window="24h",
        )
        created = float(batch.created_at)
        samples: list[dict[str, Any]] = []
        while True:
            batch = client.batches.retrieve(batch.id)
            counts = batch.request_counts
            done = (counts.completed + counts.failed) if counts else 0
            samples.append(
                {
                    "at": time.time(),
                    "done": done,
                    "estimated_end": (batch.model_extra or {}).get("estimated_completion_at"),
                }
            )
            if batch.status in ("completed", "failed", "expired", "cancelled"):
                break
            time.sleep(POLL_S)
    ended = samples[-1]["at"]
    length = ended - created

    def error(sample: dict[str, Any]) -> float | None:
        end = sample["estimated_end"]
        return None if end is None else (end - ended) / length

    first = next((s for s in samples if s["estimated_end"] is not None), None)
    tenth = next((s for s in samples if s["done"] >= args.lines / 10), None)
    later = [e for s in samples if s["done"] >= args.lines / 10 if (e := error(s)) is not None]
    figures = {
        "lines": args.lines,
        "max_tokens": args.max_tokens,
        "batch_s": round(length, 1),
        "at_creation_error": error(samples[0]),
        "first_estimate_after_s": None if first is None else round(first["at"] - created, 1),
        "first_estimate_error": None if first is None else error(first),
        "at_10_percent_error": None if tenth is None else error(tenth),
        "largest_error_from_10_percent": max(later, key=abs) if later else None,
        "samples": len(samples),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
