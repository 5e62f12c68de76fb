"""Batch work shared between tenants, on the real engine: does a small batch
wait behind another tenant's big one, does a tenant's urgent batch overtake its own
less urgent one, do weights set the shares.

    python -m bench.fairness [--big-lines 6000] [--out bench/results/fairness.json]

One deployment (the bench model and engine settings of bench.compare), three steps:
- beside: tenant A's big batch (`--big-lines`, about a minute's work); once its lines
  complete, tenant B's 40-line batch. Reported: B's time from creation to its end, and A's
  lines done then (the target: A still has most of its lines to go) and A's output in
  input order at its end.
- priority: tenant A's priority-9 big batch, then its priority-0 40-line batch: the same.
- weights: tenants L (weight 1) and H (weight 3), a batch of `--big-lines` / 2 each,
  created together: the lines each completed over the window from both having lines done
  to the first of them ending (sampled every `POLL_S`); the target is about 1 : 3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from bench import stack, workload
from bench.compare import engine_args, inferq_env
from bench.peers import SERVED
from cli.demo_model import BENCH

POLL_S = 0.5
SMALL_LINES = 40
MAX_TOKENS = 32


def tenant_key(env: dict[str, str], name: str, weight: int = 1) -> str:
    """A new API key of its own tenant (the CLI, as an admin would), with `weight`."""
    run = {**os.environ, **env}
    made = subprocess.run(
        [sys.executable, "-m", "cli.main", "keys", "create", "--name", name],
        env=run,
        capture_output=True,
        text=True,
        check=True,
    )
    secret = made.stdout.strip().splitlines()[-1]
    if weight != 1:
        key_id = made.stderr.split()[1]
        subprocess.run(
            [sys.executable, "-m", "cli.main", "keys", "update", key_id, "--weight", str(weight)],
            env=run,
            capture_output=True,
            text=True,
            check=True,
        )
    return secret


def submit_batch(
    client: openai.OpenAI,
    workdir: Path,
    name: str,
    lines: int,
    *,
    priority: int = 0,
    max_tokens: int = MAX_TOKENS,
) -> str:
    """A batch of `lines` chat lines of `max_tokens` each, uploaded and created: its id."""
    requests = [
        workload.Request(f"{name}-{i}", f"{name} item {i}: say something", max_tokens)
        for i in range(lines)
    ]
    path = workload.write_batch_file(requests, SERVED, workdir / f"{name}.jsonl")
    with path.open("rb") as f:
        uploaded = client.files.create(file=f, purpose="batch")
    return client.batches.create(
        input_file_id=uploaded.id,
        endpoint=workload.CHAT_URL,
        completion_window="24h",
        extra_body={"priority": priority},
    ).id


def _done(client: openai.OpenAI, batch_id: str) -> tuple[str, int]:
    batch = client.batches.retrieve(batch_id)
    counts = batch.request_counts
    return batch.status, (counts.completed + counts.failed) if counts else 0


def _until(client: openai.OpenAI, batch_id: str, ended: bool) -> float:
    """Wait until the batch has lines done (or has ended); returns when."""
    while True:
        status, done = _done(client, batch_id)
        if (status == "completed") if ended else done > 0:
            return time.monotonic()
        if status in ("failed", "expired", "cancelled"):
            raise RuntimeError(f"batch {batch_id} {status}")
        time.sleep(POLL_S)


def _in_order(client: openai.OpenAI, batch_id: str, lines: int) -> bool:
    batch = client.batches.retrieve(batch_id)
    assert batch.output_file_id is not None
    text = client.files.content(batch.output_file_id).text
    ids = [json.loads(line)["custom_id"] for line in text.splitlines()]
    return len(ids) == lines and ids == sorted(ids, key=lambda c: int(c.rsplit("-", 1)[1]))


def small_beside_big(
    big: openai.OpenAI,
    small: openai.OpenAI,
    workdir: Path,
    lines: int,
    *,
    name: str,
    big_priority: int = 0,
) -> dict[str, Any]:
    big_id = submit_batch(big, workdir, f"{name}-big", lines, priority=big_priority)
    _until(big, big_id, ended=False)
    created = time.monotonic()
    small_id = submit_batch(small, workdir, f"{name}-small", SMALL_LINES)
    ended = _until(small, small_id, ended=True)
    _, big_done = _done(big, big_id)
    big_ended = _until(big, big_id, ended=True)
    return {
        "big_lines": lines,
        "small_lines": SMALL_LINES,
        "small_s": round(ended - created, 1),
        "big_done_when_small_ended": big_done,
        "big_share_left_then": round(1 - big_done / lines, 3),
        "big_s_after_small": round(big_ended - ended, 1),
        "big_output_in_input_order": _in_order(big, big_id, lines),
    }


def weights(
    light: openai.OpenAI, heavy: openai.OpenAI, workdir: Path, lines: int
) -> dict[str, Any]:
    ids = {
        "light": submit_batch(light, workdir, "light", lines),
        "heavy": submit_batch(heavy, workdir, "heavy", lines),
    }
    clients = {"light": light, "heavy": heavy}
    samples: list[dict[str, int]] = []
    while True:
        now = {name: _done(clients[name], ids[name]) for name in ids}
        if any(status == "completed" for status, _ in now.values()):
            break
        samples.append({name: done for name, (_, done) in now.items()})
        time.sleep(POLL_S)
    both = [s for s in samples if s["light"] and s["heavy"]]
    first, last = both[0], both[-1]
    delta = {name: last[name] - first[name] for name in ids}
    for name, batch_id in ids.items():
        _until(clients[name], batch_id, ended=True)
    return {
        "lines_each": lines,
        "window_samples": len(both),
        "light_lines": delta["light"],
        "heavy_lines": delta["heavy"],
        "ratio": round(delta["heavy"] / max(delta["light"], 1), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--big-lines", type=int, default=6000)
    parser.add_argument("--out", type=Path, default=Path("bench/results/fairness.json"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="fairness-"))
    model = stack.demo_model(BENCH, name="bench")
    engine = engine_args(model, gpu=False)
    figures: dict[str, Any] = {}
    with stack.deployment(model, workdir, **inferq_env(engine)) as running:

        def client(secret: str) -> openai.OpenAI:
            return openai.OpenAI(base_url=running.url + "/v1", api_key=secret, timeout=600)

        a = client(tenant_key(running.env, "tenant-a"))
        b = client(tenant_key(running.env, "tenant-b"))
        light = client(tenant_key(running.env, "tenant-l"))
        heavy = client(tenant_key(running.env, "tenant-h", weight=3))
        _until(a, submit_batch(a, workdir, "warm-up", 200), ended=True)
        figures["beside"] = small_beside_big(a, b, workdir, args.big_lines, name="beside")
        print("beside", figures["beside"], flush=True)
        figures["priority"] = small_beside_big(
            a, a, workdir, args.big_lines, name="priority", big_priority=9
        )
        print("priority", figures["priority"], flush=True)
        figures["weights"] = weights(light, heavy, workdir, args.big_lines // 2)
        print("weights", figures["weights"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
