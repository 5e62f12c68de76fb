"""The first batch on a freshly started deployment: what its estimate says, as a
new user would see it, against when it really ends.

    python -m bench.fresh_estimate [--lines 20000] [--max-tokens 32] [--other-lines N]

One deployment on the tiny model (the engine settings of bench.compare); one warm-up
single job, then a batch of `--lines` lines of `--max-tokens` tokens each (the bench
workload's bodies: greedy, `ignore_eos`), read with the `openai` client every `POLL_S`
until it ends. The error of an estimate read at time t is (its end - the real end) /
(the real end - creation). Reported: the estimate at creation, when the first came, the
error at the first read with 10% of the lines done, and the largest error from then on.
The goal: none confident and wrong (no estimate is better than one far off), and within
25% from 10% of the lines on. With `--other-lines`, another tenant's batch of that many
lines is submitted once the first one's lines run: both share the engine, and both are
followed and reported the same way (`first`, and `other` for the other tenant's).
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

from bench import stack
from bench.compare import engine_args, inferq_env
from bench.fairness import submit_batch, tenant_key

POLL_S = 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--other-lines",
        type=int,
        default=0,
        help="another tenant's batch of this many lines, submitted once the first runs",
    )
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
        client = openai.OpenAI(base_url=running.url + "/v1", api_key=stack.ADMIN_KEY, timeout=600)
        first = submit_batch(client, workdir, "a", args.lines, max_tokens=args.max_tokens)
        followed = [_Followed("first", first)]
        while not followed[0].read(client) and followed[0].samples[-1]["done"] == 0:
            time.sleep(POLL_S / 10)  # until its lines run
        if args.other_lines:
            other = openai.OpenAI(
                base_url=running.url + "/v1",
                api_key=tenant_key(running.env, "tenant-b"),
                timeout=600,
            )
            second = submit_batch(other, workdir, "b", args.other_lines, max_tokens=args.max_tokens)
            followed.append(_Followed("other", second, client=other))
        while not all([f.read(f.client or client) for f in followed]):
            time.sleep(POLL_S)
    figures = {
        "lines": args.lines,
        "other_lines": args.other_lines,
        "max_tokens": args.max_tokens,
        **{f.name: f.figures() for f in followed},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


class _Followed:
    """One batch read until it ends: what its estimate said, and when."""

    def __init__(self, name: str, batch_id: str, client: openai.OpenAI | None = None) -> None:
        self.name = name
        self.batch_id = batch_id
        self.client = client
        self.samples: list[dict[str, Any]] = []
        self.created = 0.0
        self.lines = 0
        self.ended: float | None = None

    def read(self, client: openai.OpenAI) -> bool:
        """Read it once more (not after it ended); True once it has ended."""
        if self.ended is not None:
            return True
        batch = client.batches.retrieve(self.batch_id)
        self.created = float(batch.created_at)
        counts = batch.request_counts
        self.lines = counts.total if counts else 0
        self.samples.append(
            {
                "at": time.time(),
                "done": (counts.completed + counts.failed) if counts else 0,
                "estimated_end": (batch.model_extra or {}).get("estimated_completion_at"),
            }
        )
        if batch.status in ("completed", "failed", "expired", "cancelled"):
            self.ended = self.samples[-1]["at"]
        return self.ended is not None

    def figures(self) -> dict[str, Any]:
        assert self.ended is not None
        ended, length = self.ended, self.ended - self.created

        def error(sample: dict[str, Any]) -> float | None:
            end = sample["estimated_end"]
            return None if end is None else round((end - ended) / length, 4)

        first = next((s for s in self.samples if s["estimated_end"] is not None), None)

        def after(sample: dict[str, Any] | None) -> float | None:
            return None if sample is None else round(sample["at"] - self.created, 1)

        tenth = next((s for s in self.samples if s["done"] >= self.lines / 10), None)
        later = [
            e for s in self.samples if s["done"] >= self.lines / 10 if (e := error(s)) is not None
        ]
        running = self.samples[:-1]  # the last read is of the batch ended
        without = sum(1 for s in running if s["done"] >= self.lines / 10 and error(s) is None)
        return {
            "lines": self.lines,
            "batch_s": round(length, 1),
            "at_creation_error": error(self.samples[0]),
            "first_estimate_after_s": after(first),
            "first_estimate_error": None if first is None else error(first),
            "at_10_percent_after_s": after(tenth),
            "at_10_percent_error": None if tenth is None else error(tenth),
            "largest_error_from_10_percent": max(later, key=abs) if later else None,
            "reads_from_10_percent_without_estimate": without,
            "samples": len(self.samples),
        }


if __name__ == "__main__":
    main()
