"""The bench's HTTP client for single requests: inferq jobs (`POST /v1/jobs`, then
`GET /v1/jobs/{id}?wait=60` until the job ends) and vLLM chat completions
(`POST /v1/chat/completions`, not streamed), through the same aiohttp client, so that
inferq and `vllm serve` are driven alike.

Why aiohttp: at 256 concurrent clients httpx's AsyncClient alone burned 0.85 of a core
and capped the bench near 50 jobs/s; aiohttp does the same work at 0.09 of a core. On a
small host the client shares the CPU with the systems it measures, so its cost shows up
in theirs.
"""

from __future__ import annotations

import asyncio
import functools
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from bench import stack
from bench.peers import throughput

ACTIVE = frozenset({"queued", "running"})
WAIT_S = 60
# Open-loop arrivals are not gated: a Poisson client that waited for a free connection
# would hide the very queueing it measures. This only bounds sockets.
OPEN_LOOP_CONNECTIONS = 512

Call = Callable[[aiohttp.ClientSession, dict[str, Any]], Awaitable[int]]


def session(base_url: str, *, connections: int, api_key: str | None) -> aiohttp.ClientSession:
    """One pooled client; call it inside a running event loop."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return aiohttp.ClientSession(
        base_url,
        headers=headers,
        connector=aiohttp.TCPConnector(limit=connections),
        timeout=aiohttp.ClientTimeout(total=3600),
    )


def inferq_session(base_url: str, *, connections: int) -> aiohttp.ClientSession:
    return session(base_url, connections=connections, api_key=stack.ADMIN_KEY)


async def read_json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The body of a 2xx response; anything else raises with the body, which says why."""
    if response.status >= 400:
        text = await response.text()
        raise RuntimeError(f"{response.method} {response.url}: {response.status} {text[:500]}")
    body: dict[str, Any] = await response.json()
    return body


async def job(
    client: aiohttp.ClientSession, body: dict[str, Any], *, wait_in_post: bool = True
) -> dict[str, Any]:
    """Submit one inferq job and wait until it has ended; the job as last read. The
    submission itself waits (`POST /v1/jobs?wait=`), or with `wait_in_post=False` the
    client long-polls `GET /v1/jobs/{id}?wait=` from the start, as before that existed."""
    params = {"wait": WAIT_S} if wait_in_post else {}
    async with client.post("/v1/jobs", json=body, params=params) as response:
        submitted = await read_json(response)
    while submitted["status"] in ACTIVE:
        async with client.get(f"/v1/jobs/{submitted['id']}", params={"wait": WAIT_S}) as response:
            submitted = await read_json(response)
    return submitted


async def job_tokens(
    client: aiohttp.ClientSession, body: dict[str, Any], *, wait_in_post: bool = True
) -> int:
    """One job to its end; the tokens it generated. A job that did not succeed raises."""
    done = await job(client, body, wait_in_post=wait_in_post)
    if done["status"] != "succeeded":
        raise RuntimeError(f"job {done['id']} ended {done['status']}: {done.get('error')}")
    return int(done["usage"]["completion_tokens"])


async def chat_tokens(client: aiohttp.ClientSession, body: dict[str, Any]) -> int:
    """One chat completion from vLLM's server; the tokens it generated."""
    async with client.post("/v1/chat/completions", json=body) as response:
        done = await read_json(response)
    return int(done["usage"]["completion_tokens"])


async def timed_job(client: aiohttp.ClientSession, body: dict[str, Any]) -> float:
    """Seconds from submission to the result of one successful job."""
    started = time.perf_counter()
    await job_tokens(client, body)
    return time.perf_counter() - started


async def closed_loop(
    client: aiohttp.ClientSession, call: Call, bodies: list[dict[str, Any]], concurrency: int
) -> dict[str, Any]:
    """Every body through `call`, `concurrency` at a time; throughput figures."""
    gate = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> int:
        async with gate:
            return await call(client, body)

    started = time.perf_counter()
    tokens = await asyncio.gather(*(one(b) for b in bodies))
    seconds = time.perf_counter() - started
    return throughput(seconds, sum(tokens), len(bodies), concurrency=concurrency)


def inferq_jobs(
    base_url: str,
    bodies: list[dict[str, Any]],
    *,
    concurrency: int,
    wait_in_post: bool = True,
) -> Any:
    """Single inferq jobs, `concurrency` in flight: throughput figures."""
    call = functools.partial(job_tokens, wait_in_post=wait_in_post)

    async def run() -> dict[str, Any]:
        async with inferq_session(base_url, connections=concurrency) as client:
            return await closed_loop(client, call, bodies, concurrency)

    return asyncio.run(run())


def serve_chats(base_url: str, bodies: list[dict[str, Any]], *, concurrency: int) -> Any:
    """Chat completions from `vllm serve`, `concurrency` in flight: throughput figures."""

    async def run() -> dict[str, Any]:
        async with session(base_url, connections=concurrency, api_key=None) as client:
            return await closed_loop(client, chat_tokens, bodies, concurrency)

    return asyncio.run(run())


def one_at_a_time(base_url: str, body: dict[str, Any], count: int) -> list[float]:
    """`count` jobs, each submitted when the one before has its result: their latencies."""

    async def run() -> list[float]:
        async with inferq_session(base_url, connections=1) as client:
            return [await timed_job(client, body) for _ in range(count)]

    return asyncio.run(run())


async def arrivals(
    client: aiohttp.ClientSession,
    body: dict[str, Any],
    *,
    rate_per_s: float,
    duration_s: float,
    rng: random.Random,
) -> list[asyncio.Task[float]]:
    """Jobs submitted as a Poisson process for `duration_s`; returns when the arrivals
    stop, with the jobs still running (await them for their latencies)."""
    tasks = []
    started = time.perf_counter()
    while time.perf_counter() - started < duration_s:
        tasks.append(asyncio.create_task(timed_job(client, body)))
        await asyncio.sleep(rng.expovariate(rate_per_s))
    return tasks


def poisson(
    base_url: str, body: dict[str, Any], *, rate_per_s: float, duration_s: float, rng: random.Random
) -> list[float]:
    """Latencies of jobs arriving as a Poisson process, sorted."""

    async def run() -> list[float]:
        async with inferq_session(base_url, connections=OPEN_LOOP_CONNECTIONS) as client:
            tasks = await arrivals(
                client, body, rate_per_s=rate_per_s, duration_s=duration_s, rng=rng
            )
            return sorted(await asyncio.gather(*tasks))

    return asyncio.run(run())


def percentiles(latencies: list[float]) -> dict[str, float]:
    """p50 and p99 of a small sample; 'inclusive' keeps p99 within what was seen."""
    if len(latencies) < 2:
        only = latencies[0] if latencies else float("nan")
        return {"p50_s": only, "p99_s": only}
    cuts = statistics.quantiles(latencies, n=100, method="inclusive")
    return {"p50_s": statistics.median(latencies), "p99_s": cuts[98]}
