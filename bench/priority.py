"""The priority step: interactive latency while a batch saturates the engine, and what
the interactive jobs cost the batch.

A big batch is submitted and, once its lines are completing, measured for a window alone
(its completed lines and generated tokens per second, from `GET /v1/batches/{id}`), then
for a window of the same length with interactive single jobs arriving as a Poisson
process; then it is cancelled. The targets: interactive p50 within 1.5x and p99 within
2x of the idle system's, and the batch at 0.95x or more of its rate alone.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench import drive, workload

ENDED = frozenset({"completed", "failed", "expired", "cancelled"})
POLL_S = 0.5
START_TIMEOUT_S = 600
CANCEL_TIMEOUT_S = 600


@dataclass(frozen=True, kw_only=True)
class Progress:
    """A batch's finished work at one moment."""

    at_s: float
    status: str
    lines: int
    tokens: int | None  # None where the API gives no usage
    left: int

    def rates_since(self, start: Progress, *, max_num_seqs: int) -> dict[str, Any]:
        seconds = self.at_s - start.at_s
        tokens = None
        if self.tokens is not None and start.tokens is not None:
            tokens = (self.tokens - start.tokens) / seconds
        return {
            "seconds": seconds,
            "lines_per_s": (self.lines - start.lines) / seconds,
            "tokens_per_s": tokens,
            # Fewer lines left than the engine runs at once: it was no longer full.
            "saturated": self.status == "in_progress" and self.left >= max_num_seqs,
        }


async def _batch(client: aiohttp.ClientSession, batch_id: str) -> dict[str, Any]:
    async with client.get(f"/v1/batches/{batch_id}") as response:
        return await drive.read_json(response)


async def progress(client: aiohttp.ClientSession, batch_id: str) -> Progress:
    # Stamped at the middle of the request: reading the counts takes a query over every
    # line, and the counts are those of some moment within it.
    sent = time.perf_counter()
    batch = await _batch(client, batch_id)
    counts = batch["request_counts"]
    output = batch.get("usage", {}).get("output_tokens")
    return Progress(
        at_s=(sent + time.perf_counter()) / 2,
        status=batch["status"],
        lines=counts["completed"],
        tokens=None if output is None else int(output),
        left=counts["total"] - counts["completed"] - counts["failed"],
    )


async def submit(client: aiohttp.ClientSession, batch_file: Path) -> str:
    """Upload the file and create a batch from it; the batch's id."""
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", batch_file.read_bytes(), filename=batch_file.name)
    async with client.post("/v1/files", data=form) as response:
        uploaded = await drive.read_json(response)
    create = {
        "input_file_id": uploaded["id"],
        "endpoint": workload.CHAT_URL,
        "completion_window": "24h",
    }
    async with client.post("/v1/batches", json=create) as response:
        batch = await drive.read_json(response)
    return str(batch["id"])


async def wait_until_completing(client: aiohttp.ClientSession, batch_id: str) -> None:
    deadline = time.perf_counter() + START_TIMEOUT_S
    while True:
        now = await progress(client, batch_id)
        if now.lines > 0:
            return
        if now.status in ENDED or time.perf_counter() > deadline:
            raise RuntimeError(f"batch {batch_id} is {now.status} and completed no line")
        await asyncio.sleep(POLL_S)


async def cancel(client: aiohttp.ClientSession, batch_id: str) -> float:
    """Cancel the batch and wait until it has ended; the seconds that took."""
    started = time.perf_counter()
    batch = await _batch(client, batch_id)
    if batch["status"] in ENDED:  # it ran out first: nothing to cancel
        return 0.0
    async with client.post(f"/v1/batches/{batch_id}/cancel") as response:
        batch = await drive.read_json(response)
    while batch["status"] not in ENDED:
        if time.perf_counter() - started > CANCEL_TIMEOUT_S:
            raise RuntimeError(f"batch {batch_id} still {batch['status']} after cancel")
        await asyncio.sleep(POLL_S)
        batch = await _batch(client, batch_id)
    return time.perf_counter() - started


async def _measure(
    client: aiohttp.ClientSession,
    batch_id: str,
    body: dict[str, Any],
    *,
    window_s: float,
    rate_per_s: float,
    max_num_seqs: int,
) -> dict[str, Any]:
    await wait_until_completing(client, batch_id)
    start = await progress(client, batch_id)
    await asyncio.sleep(window_s)
    alone = await progress(client, batch_id)
    jobs = await drive.arrivals(
        client, body, rate_per_s=rate_per_s, duration_s=window_s, rng=random.Random(workload.SEED)
    )
    loaded = await progress(client, batch_id)
    latencies = sorted(await asyncio.gather(*jobs))
    return {
        "batch_alone": alone.rates_since(start, max_num_seqs=max_num_seqs),
        "batch_loaded": loaded.rates_since(alone, max_num_seqs=max_num_seqs),
        "interactive": {"rate": rate_per_s, "jobs": len(latencies), **drive.percentiles(latencies)},
        "cancel_s": await cancel(client, batch_id),
    }


def run_priority(
    base_url: str,
    *,
    batch_file: Path,
    lines: int,
    body: dict[str, Any],
    window_s: float,
    rate_per_s: float,
    max_num_seqs: int,
    idle: dict[str, Any] | None,
) -> dict[str, Any]:
    """The priority step on a running deployment; `idle` (the idle step's figures) gives
    the latency ratios, `max_num_seqs` (the engine's) tells whether the batch kept it full."""

    async def run() -> dict[str, Any]:
        async with drive.inferq_session(
            base_url, connections=drive.OPEN_LOOP_CONNECTIONS
        ) as client:
            batch_id = await submit(client, batch_file)
            return await _measure(
                client,
                batch_id,
                body,
                window_s=window_s,
                rate_per_s=rate_per_s,
                max_num_seqs=max_num_seqs,
            )

    measured = asyncio.run(run())
    return {"batch_lines": lines, "window_s": window_s, **measured, **ratios(measured, idle)}


def ratios(measured: dict[str, Any], idle: dict[str, Any] | None) -> dict[str, Any]:
    """The three figures the targets are set on (None where a figure is missing)."""
    alone, loaded = measured["batch_alone"], measured["batch_loaded"]
    # Tokens weigh long and short lines fairly; lines where the API gives no usage.
    by_tokens = alone["tokens_per_s"] is not None and loaded["tokens_per_s"] is not None
    key = "tokens_per_s" if by_tokens else "lines_per_s"
    interactive = measured["interactive"]
    return {
        "batch_x_alone": loaded[key] / alone[key] if alone[key] else None,
        "batch_rate_by": key,
        "p50_x_idle": interactive["p50_s"] / idle["p50_s"] if idle else None,
        "p99_x_idle": interactive["p99_s"] / idle["p99_s"] if idle and "p99_s" in idle else None,
    }
