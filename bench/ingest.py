"""Ingest of a bulk file: upload, then validate every line and queue it (POST /v1/batches).

Runs a real API on its own database and Redis prefix, through the official `openai`
client, once per file size, each in a fresh API process so that its peak memory (VmHWM)
belongs to that size alone. No GPU worker runs: this measures ingest, not inference.

    python bench/ingest.py                   # 5,000 and 50,000 lines
    python bench/ingest.py --lines 50000
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import openai

from bench import stack

TOPICS = ("rivers", "compilers", "bread", "glaciers", "chess", "bees", "tides", "ledgers")


def write_file(path: Path, lines: int) -> None:
    with path.open("w") as out:
        for i in range(lines):
            body = {
                "model": stack.MODEL_NAME,
                "messages": [
                    {"role": "system", "content": "You answer in one paragraph."},
                    {
                        "role": "user",
                        "content": f"Request {i}: write three sentences about "
                        f"{TOPICS[i % len(TOPICS)]} for a curious reader.",
                    },
                ],
                "max_tokens": 64,
                "temperature": 0.7,
            }
            line = {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions"}
            out.write(json.dumps({**line, "body": body}) + "\n")


def measure(lines: int, workdir: Path) -> dict[str, float | int]:
    path = workdir / f"input-{lines}.jsonl"
    write_file(path, lines)
    model = stack.demo_model()
    with stack.database() as url, stack.key_prefix() as prefix:
        env = stack.service_env(model=model, database_url=url, prefix=prefix)
        with stack.api(env, workdir) as (api, base_url):
            client = openai.OpenAI(base_url=base_url + "/v1", api_key=stack.ADMIN_KEY, timeout=600)
            idle_mb = api.peak_rss_mb()
            started = time.perf_counter()
            with path.open("rb") as f:
                uploaded = client.files.create(file=f, purpose="batch")
            upload_s = time.perf_counter() - started
            started = time.perf_counter()
            batch = client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
            create_s = time.perf_counter() - started
            assert batch.status == "in_progress", batch
            assert batch.request_counts is not None
            assert batch.request_counts.total == lines, batch.request_counts
            return {
                "lines": lines,
                "file_mb": round(path.stat().st_size / 2**20, 1),
                "upload_s": round(upload_s, 2),
                "validate_and_queue_s": round(create_s, 2),
                "lines_per_s": round(lines / create_s),
                "api_idle_rss_mb": round(idle_mb),
                "api_peak_rss_mb": round(api.peak_rss_mb()),
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, action="append", help="file sizes to measure")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="inferq-bench-") as tmp:
        for lines in args.lines or [5_000, 50_000]:
            rows.append(measure(lines, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    header = list(rows[0])
    print("\n| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in header) + " |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
