"""The chaos run's clients: a steady mixed load on both APIs, and the history of what each
client was told.

- single jobs (`POST /v1/jobs`), a share with an `Idempotency-Key` (and the key in their
  metadata, so Postgres can be asked how many jobs it made), retried on the other API
  on a connection error or a 5xx; a share with a webhook;
- online chats, streamed and not, sampled at temperature 1 with no seed, so that a job
  run twice would most likely say something else the second time;
- batch files of a few hundred lines, created under an `Idempotency-Key` and retried the
  same way, a share with a webhook;
- cancels of random recent jobs and batches.
Each outcome is one record of `History`; nothing is asserted here (bench/chaos/check.py
reads it all at the end).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.chaos.cluster import ADMIN_KEY, MODEL_NAME, POISON_SEED

SINGLE_JOBS_PER_S = 3.0
CHATS_PER_S = 1.0
STREAMS_PER_S = 1.0
BATCH_EVERY_S = (20.0, 40.0)
JOB_CANCEL_EVERY_S = (5.0, 15.0)
BATCH_CANCEL_EVERY_S = (60.0, 120.0)
IDEMPOTENT_SHARE = 0.3
WEBHOOK_SHARE = 0.2
TRIES = 6
RETRY_AFTER_S = 1.0
# Long enough that a request cut short was cut by the server, not by this client.
REQUEST_TIMEOUT_S = 600
# Errors that leave a client not knowing whether its request was taken.
CONNECTION_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, TimeoutError)


@dataclass
class History:
    """What each client was told, in order."""

    records: list[dict[str, Any]] = field(default_factory=list)

    def add(self, kind: str, **fields: Any) -> None:
        self.records.append({"kind": kind, "at": time.time(), **fields})

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


class Load:
    def __init__(self, urls: list[str], *, history: History, webhook_url: str, seed: int) -> None:
        self._urls = urls
        self._history = history
        self._webhook_url = webhook_url
        self._rng = random.Random(seed)
        self._numbers = itertools.count()
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """The load until `stop`; then every request under way is let finish."""
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            self._session = session
            actors = [
                self._every(stop, lambda: self._rng.expovariate(SINGLE_JOBS_PER_S), self.job),
                self._every(stop, lambda: self._rng.expovariate(CHATS_PER_S), self.chat),
                self._every(stop, lambda: self._rng.expovariate(STREAMS_PER_S), self.stream),
                self._every(stop, lambda: self._rng.uniform(*BATCH_EVERY_S), self.batch),
                self._every(stop, lambda: self._rng.uniform(*JOB_CANCEL_EVERY_S), self.cancel_job),
                self._every(
                    stop, lambda: self._rng.uniform(*BATCH_CANCEL_EVERY_S), self.cancel_batch
                ),
            ]
            await asyncio.gather(*actors)
            if self._tasks:
                await asyncio.wait(self._tasks)

    async def _every(
        self,
        stop: asyncio.Event,
        wait_s: Callable[[], float],
        call: Callable[[], Coroutine[Any, Any, None]],
    ) -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait_s())
            if stop.is_set():
                return
            task = asyncio.create_task(call())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _url(self) -> str:
        return self._rng.choice(self._urls)

    async def _post(
        self, path: str, *, retry: bool, **kwargs: Any
    ) -> tuple[int | None, Any, int, str | None]:
        """POST to one API and, with `retry`, to the others until an answer that is not a
        5xx: (status, body, tries, last error)."""
        assert self._session is not None
        error = None
        for attempt in range(1, (TRIES if retry else 1) + 1):
            try:
                async with self._session.post(self._url() + path, **kwargs) as response:
                    body = await response.json(content_type=None)
                    if response.status < 500 or not retry or attempt == TRIES:
                        return response.status, body, attempt, None
                    error = f"HTTP {response.status}"
            except (*CONNECTION_ERRORS, json.JSONDecodeError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(RETRY_AFTER_S)
        return None, None, TRIES if retry else 1, error

    async def job(self, *, seed: int | None = None) -> None:
        n = next(self._numbers)
        key = f"job-{n}" if self._rng.random() < IDEMPOTENT_SHARE else None
        body: dict[str, Any] = {
            "model": MODEL_NAME,
            "prompt": f"Chaos job {n} says",
            "max_tokens": self._rng.randint(8, 48),
            "metadata": {"chaos": str(n)} | ({"chaos_key": key} if key else {}),
        }
        if seed is not None:
            body["seed"] = seed
        webhook = self._rng.random() < WEBHOOK_SHARE
        if webhook:
            body["webhook_url"] = self._webhook_url
        headers = {"Idempotency-Key": key} if key else {}
        status, answer, tries, error = await self._post(
            "/v1/jobs", retry=key is not None, json=body, headers=headers
        )
        self._history.add(
            "poison" if seed is not None else "job",
            key=key,
            webhook=webhook,
            status=status,
            job_id=answer.get("id") if status in (200, 201, 202) else None,
            tries=tries,
            error=error,
        )

    async def poison(self) -> None:
        """A job whose request kills the engine core each time it enters it."""
        await self.job(seed=POISON_SEED)

    def _chat_body(self, *, stream: bool) -> dict[str, Any]:
        n = next(self._numbers)
        return {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": f"Chaos chat {n}: tell me something."}],
            "max_tokens": self._rng.randint(8, 48),
            "temperature": 1.0,
            "stream": stream,
        }

    async def chat(self) -> None:
        status, answer, _, error = await self._post(
            "/v1/chat/completions", retry=False, json=self._chat_body(stream=False)
        )
        ok = status == 200 and answer is not None
        self._history.add(
            "chat",
            status=status,
            job_id="job_" + answer["id"].removeprefix("chatcmpl-") if ok else None,
            text=answer["choices"][0]["message"]["content"] if ok else None,
            error=error,
        )

    async def stream(self) -> None:
        assert self._session is not None
        job_id, text, ending, status = None, "", "cut", None
        try:
            async with self._session.post(
                self._url() + "/v1/chat/completions", json=self._chat_body(stream=True)
            ) as response:
                status = response.status
                if status != 200:
                    ending = "refused"
                else:
                    async for raw in response.content:
                        line = raw.decode().strip()
                        if not line.startswith("data:"):
                            continue
                        data = line.removeprefix("data:").strip()
                        if data == "[DONE]":
                            ending = "done"
                            break
                        chunk = json.loads(data)
                        if "error" in chunk:
                            ending = "error"
                            break
                        job_id = "job_" + chunk["id"].removeprefix("chatcmpl-")
                        for choice in chunk["choices"]:
                            text += choice["delta"].get("content") or ""
        except TimeoutError:
            ending = "timeout"
        except CONNECTION_ERRORS:
            ending = "cut"
        self._history.add("stream", status=status, job_id=job_id, text=text, ending=ending)

    async def batch(self) -> None:
        n = next(self._numbers)
        lines = self._rng.randint(100, 300)
        content = "".join(
            json.dumps(
                {
                    "custom_id": f"b{n}-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": MODEL_NAME,
                        "messages": [{"role": "user", "content": f"Line {i} of batch {n}"}],
                        "max_tokens": self._rng.randint(8, 24),
                    },
                }
            )
            + "\n"
            for i in range(lines)
        )
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content.encode(), filename=f"chaos-{n}.jsonl")
        status, uploaded, _, error = await self._post("/v1/files", retry=True, data=form)
        if status != 200:
            self._history.add("batch", status=status, batch_id=None, lines=lines, error=error)
            return
        webhook = self._rng.random() < WEBHOOK_SHARE
        body: dict[str, Any] = {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        }
        if webhook:
            body["webhook_url"] = self._webhook_url
        key = f"batch-{n}"
        status, batch, tries, error = await self._post(
            "/v1/batches", retry=True, json=body, headers={"Idempotency-Key": key}
        )
        self._history.add(
            "batch",
            key=key,
            status=status,
            batch_id=batch.get("id") if status == 200 else None,
            lines=lines,
            webhook=webhook,
            tries=tries,
            error=error,
        )

    async def cancel_job(self) -> None:
        recent = [r["job_id"] for r in self._history.of("job")[-50:] if r["job_id"]]
        if recent:
            job_id = self._rng.choice(recent)
            status, _, _, error = await self._post(f"/v1/jobs/{job_id}/cancel", retry=True)
            self._history.add("cancel", target=job_id, status=status, error=error)

    async def cancel_batch(self) -> None:
        recent = [r["batch_id"] for r in self._history.of("batch")[-5:] if r["batch_id"]]
        if recent:
            batch_id = self._rng.choice(recent)
            status, _, _, error = await self._post(f"/v1/batches/{batch_id}/cancel", retry=True)
            self._history.add("cancel", target=batch_id, status=status, error=error)
