"""Following a job's output as it is generated: what SSE responses are made of.

A streamed job's tokens are read from its Redis Stream (`inferq.broker.token_stream`): replayed
from the first entry, then followed with blocking reads, each holding one pooled
connection for at most `RECHECK_S`, so a reader that stops reading holds nothing else.
Between reads that bring nothing the job is read from Postgres, which tells a job that
ended without more tokens (cancelled, failed). A job that was not streamed, a stream
that expired or a gap in one (entries trimmed or lost) is followed through Postgres: its
output, or the rest of it, comes once the job has ended.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from redis.asyncio import Redis
from redis.exceptions import RedisError

from api.waiter import RECHECK_S, JobWaiter, ReadJob
from inferq.broker.token_stream import ChoiceDelta, decode_entry, tokens_key
from inferq.domain.jobs import Job, JobStatus
from inferq.exceptions import InferqError

# Most entries taken in one read.
READ_ENTRIES = 512


class OutputRestarted(InferqError):
    """The job's run was lost (its worker or engine died) after some of its output had
    been sent; it is running again from the start, so the output sent so far is void."""


@dataclass
class _Sent:
    tokens: int = 0
    chars: int = 0
    finish_reason: str | None = None

    def add(self, delta: ChoiceDelta) -> None:
        self.tokens += delta.tokens
        self.chars += len(delta.text)
        self.finish_reason = delta.finish_reason


@dataclass(frozen=True)
class Ended:
    """How a followed job ended. `job` is as stored, or None when the engine's last
    tokens ended it and the stored result may not be written yet."""

    status: JobStatus
    prompt_tokens: int
    completion_tokens: int
    job: Job | None = None


@dataclass
class _Progress:
    n: int
    sent: dict[int, _Sent] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.sent = {i: _Sent() for i in range(self.n)}

    @property
    def any_sent(self) -> bool:
        return any(s.tokens or s.chars for s in self.sent.values())

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
        """What of a succeeded job's output has not been sent yet."""
        assert job.result is not None
        rest = []
        for choice in job.result.choices:
            sent = self.sent.setdefault(choice.index, _Sent())
            if sent.finish_reason is not None:
                continue
            logprobs = None
            if choice.logprobs is not None:
                logprobs = choice.logprobs[sent.tokens :]
            delta = ChoiceDelta(
                index=choice.index,
                text=choice.text[sent.chars :],
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

    def __init__(self, redis: Redis, *, key_prefix: str, waiter: JobWaiter) -> None:
        self._redis = redis
        self._key_prefix = key_prefix
        self._waiter = waiter

    async def follow(
        self, job: Job, *, read: ReadJob, stored: bool = False
    ) -> AsyncIterator[list[ChoiceDelta] | Ended]:
        """The job's output as it comes (each choice's text continued, never repeated),
        then how it ended: as soon as the engine's last tokens came, or with `stored` once
        the result is written too. Raises `OutputRestarted` if its run began again after
        output was sent. `read` re-reads the job (in its caller's scope)."""
        progress = _Progress(job.sampling.n)
        if job.stream and not job.status.is_terminal:
            async for deltas in self._from_stream(job, progress, read=read):
                yield deltas
            aborted = any(s.finish_reason == "abort" for s in progress.sent.values())
            if progress.finished and not aborted and not stored:
                yield Ended(JobStatus.SUCCEEDED, job.prompt_tokens, progress.tokens)
                return
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
        last = "0-0"
        while not progress.finished:
            try:
                reply = await self._redis.xread(
                    {key: last},
                    count=READ_ENTRIES,
                    block=int(RECHECK_S * 1000),  # then look in Postgres
                )
            except RedisError:
                return  # Redis is out of reach: the stored result will do
            if not reply:
                if (await read(job.id)).status.is_terminal:
                    return
                continue
            for entry_id, fields in reply[0][1]:
                last = entry_id
                deltas = decode_entry(fields)
                if deltas is None:  # a run began (again)
                    if progress.any_sent:
                        raise OutputRestarted(
                            f"the worker or engine running job {job.id} was lost after part "
                            "of its output was sent; it is running again from the start: "
                            f"follow it at /v1/jobs/{job.id}/stream"
                        )
                    continue
                taken = progress.take(deltas)
                if taken is None:
                    return
                yield taken
