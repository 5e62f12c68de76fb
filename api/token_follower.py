"""Following a job's output as it is generated: what SSE responses are made of.

A streamed job's tokens are read from its Redis Stream (`inferq.broker.token_stream`),
replayed from the first entry and then followed by the process's one reader of every
followed stream (`api.stream_reader`); after `RECHECK_S` without entries the job is read
from Postgres. A job not streamed, an expired stream or a gap in one is followed through
Postgres: its output, or the rest of it, comes once the job has ended. A Postgres
restart does not end a stream: its reads wait up to `STORE_OUTAGE_S`; longer, or a run
lost after output was sent, and the stream ends with an error event (`StreamBroken`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from api.stream_reader import StreamReader
from api.waiter import RECHECK_S, JobWaiter, ReadJob
from inferq.broker.token_stream import ChoiceDelta, decode_entry, tokens_key
from inferq.domain.jobs import Job, JobStatus
from inferq.exceptions import InferqError, StoreUnavailable

log = logging.getLogger(__name__)

# How long a stream waits for Postgres to come back (a restart takes seconds).
STORE_OUTAGE_S = 60.0
STORE_RETRY_S = 0.5


class StreamBroken(InferqError):
    """A stream that cannot go on; its client is told with an error event of `code`."""

    code = "stream_broken"


class OutputRestarted(StreamBroken):
    """The job's run was lost (its worker or engine died) after some of its output had
    been sent; it is running again from the start, so the output sent so far is void."""

    code = "restarted"


class StoreOutage(StreamBroken, StoreUnavailable):
    """The database stayed out of reach longer than a client waits for it (503 where
    nothing was sent yet)."""

    code = "store_unavailable"


@dataclass
class _Sent:
    tokens: int = 0
    parts: list[str] = field(default_factory=list)
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def add(self, delta: ChoiceDelta) -> None:
        self.tokens += delta.tokens
        self.parts.append(delta.text)
        self.finish_reason = delta.finish_reason


@dataclass(frozen=True)
class Ended:
    """How a followed job ended, as stored."""

    status: JobStatus
    prompt_tokens: int
    completion_tokens: int
    job: Job


@dataclass
class _Progress:
    n: int
    # Whether the stored output must begin with what was sent (see `rest`).
    checked: bool = True
    sent: dict[int, _Sent] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sent = {i: _Sent() for i in range(self.n)}

    @property
    def any_sent(self) -> bool:
        return any(s.tokens or s.parts for s in self.sent.values())

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.sent.values())

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sent.values())

    def take(self, deltas: list[ChoiceDelta]) -> list[ChoiceDelta] | None:
        """The deltas that continue each choice's output; None at a gap."""
        for delta in deltas:
            sent = self.sent.get(delta.index)
            if sent is None or delta.offset != sent.tokens or sent.finish_reason is not None:
                return None
        for delta in deltas:
            self.sent[delta.index].add(delta)
        return deltas

    def rest(self, job: Job) -> list[ChoiceDelta]:
        """What of a succeeded job's output has not been sent yet. `OutputRestarted` if
        what was sent is not how the stored output begins: the tokens sent came from a
        run that was lost (its start going unseen: Redis lost the stream, or could not be
        read), and the result is another run's."""
        assert job.result is not None
        rest = []
        for choice in job.result.choices:
            sent = self.sent.setdefault(choice.index, _Sent())
            sent_text = sent.text
            ended = sent.finish_reason is not None
            matches = choice.text == sent_text if ended else choice.text.startswith(sent_text)
            if self.checked and not matches:
                raise OutputRestarted(
                    f"the output of job {job.id} sent so far came from a run that was lost "
                    "(its worker or engine died); it ran again from the start: read it at "
                    f"/v1/jobs/{job.id}"
                )
            if ended:
                continue
            logprobs = None
            if choice.logprobs is not None:
                logprobs = choice.logprobs[sent.tokens :]
            delta = ChoiceDelta(
                index=choice.index,
                text=choice.text[len(sent_text) :],
                offset=sent.tokens,
                tokens=choice.completion_tokens - sent.tokens,
                logprobs=logprobs,
                finish_reason=choice.finish_reason or "stop",
            )
            sent.add(delta)
            rest.append(delta)
        return rest


class TokenFollower:
    """Follows jobs for this API process's streaming responses."""

    def __init__(self, reader: StreamReader, *, key_prefix: str, waiter: JobWaiter) -> None:
        self._reader = reader
        self._key_prefix = key_prefix
        self._waiter = waiter

    async def follow(
        self, job: Job, *, read: ReadJob, held: bool = False
    ) -> AsyncIterator[list[ChoiceDelta] | Ended]:
        """The job's output as it comes (each choice's text continued, never repeated),
        then how it ended, once its result is stored: a client is never told an output
        that is not the one kept (a run lost after its last tokens were sent, and run
        again, keeps another). Raises `OutputRestarted` if its run began again after
        output was sent. `read` re-reads the job (in its caller's scope). `held`: the
        caller sends nothing before the end (a chat's tool calls), so the output comes
        whole from the stored result."""
        read = riding_out(read)
        # The stored text of a job with tools is what remains once the calls are read
        # out of the generated text: it cannot be held against the tokens sent.
        progress = _Progress(job.sampling.n, checked=job.sampling.tool_choice is None)
        if job.stream and not job.status.is_terminal and not held:
            async for deltas in self._from_stream(job, progress, read=read):
                yield deltas
        job = await self._waiter.until_ended(job.id, read)
        if job.status is JobStatus.SUCCEEDED and (rest := progress.rest(job)):
            yield rest
        completion_tokens = job.result.completion_tokens if job.result else progress.tokens
        yield Ended(job.status, job.prompt_tokens, completion_tokens, job)

    async def _from_stream(
        self, job: Job, progress: _Progress, *, read: ReadJob
    ) -> AsyncIterator[list[ChoiceDelta]]:
        """Deltas from the job's Redis Stream until its choices have finished, a gap, or
        the job has ended without them (the caller then finishes from Postgres)."""
        key = tokens_key(self._key_prefix, job.id)
        async with self._reader.follow(key) as arriving:
            while not progress.finished:
                try:
                    entries = await asyncio.wait_for(arriving.get(), RECHECK_S)
                except TimeoutError:  # nothing for a while: look in Postgres
                    if (await read(job.id)).status.is_terminal:
                        return
                    continue
                if entries is None:
                    return  # Redis is out of reach: the stored result will do
                for _entry_id, fields in entries:
                    deltas = decode_entry(fields)
                    if deltas is None:  # a run began (again)
                        if progress.any_sent:
                            raise OutputRestarted(
                                f"the worker or engine running job {job.id} was lost after "
                                "part of its output was sent; it is running again from the "
                                f"start: follow it at /v1/jobs/{job.id}/stream"
                            )
                        continue
                    taken = progress.take(deltas)
                    if taken is None:
                        return
                    yield taken


def riding_out(read: ReadJob) -> ReadJob:
    """`read` for a job a client waits on, waiting out a database outage of up to
    `STORE_OUTAGE_S`, then raising `StoreOutage`."""

    async def steady(job_id: str) -> Job:
        deadline = time.monotonic() + STORE_OUTAGE_S
        told = False
        while True:
            try:
                return await read(job_id)
            except StoreUnavailable as exc:
                if not told:
                    log.warning("job %s: waiting for the database (%s)", job_id, exc.message)
                    told = True
                if time.monotonic() >= deadline:
                    raise StoreOutage(
                        f"the database was out of reach for {STORE_OUTAGE_S:.0f} s while job "
                        f"{job_id} was followed ({exc.message}); the job goes on: read it at "
                        f"/v1/jobs/{job_id}"
                    ) from exc
                await asyncio.sleep(STORE_RETRY_S)

    return steady
