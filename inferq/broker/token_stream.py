"""Tokens as they are generated, carried from the GPU worker to the API through Redis.

Only jobs submitted with `stream` are carried, each on a Redis Stream of its own. Each
time the job enters an engine a `start` entry is appended, then `delta` entries, each with
the new text of one or more of its choices, the tokens that text covers, their logprobs
and, on a choice's last, its finish reason. Readers replay from the first entry and block
for more at their own pace. A stream is bounded in length (`max_entries`) and in life
(`ttl_s` after its last entry); Postgres still gets the whole result, so a reader that
finds entries missing (a gap in a choice's token offsets) takes the rest from there."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from redis import Redis
from redis.exceptions import RedisError

from inferq.constants import TOKENS_STREAM
from inferq.domain.logprobs import TokenLogprob

log = logging.getLogger(__name__)

_START = b"start"
_DELTA = b"delta"


def tokens_key(key_prefix: str, job_id: str) -> str:
    """The Redis Stream that carries `job_id`'s tokens."""
    return f"{key_prefix}{TOKENS_STREAM}:{job_id}"


@dataclass(frozen=True, kw_only=True)
class ChoiceDelta:
    """New output of one choice: `tokens` tokens after the first `offset`."""

    index: int
    text: str
    offset: int
    tokens: int
    logprobs: tuple[TokenLogprob, ...] | None = None
    finish_reason: str | None = None

    def then(self, later: ChoiceDelta) -> ChoiceDelta:
        """This delta followed by `later` (of the same choice), as one."""
        logprobs = None
        if self.logprobs is not None or later.logprobs is not None:
            logprobs = (*(self.logprobs or ()), *(later.logprobs or ()))
        return ChoiceDelta(
            index=self.index,
            text=self.text + later.text,
            offset=self.offset,
            tokens=self.tokens + later.tokens,
            logprobs=logprobs,
            finish_reason=later.finish_reason,
        )

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {
            "index": self.index,
            "text": self.text,
            "offset": self.offset,
            "tokens": self.tokens,
        }
        if self.logprobs is not None:
            data["logprobs"] = [lp.to_dict() for lp in self.logprobs]
        if self.finish_reason is not None:
            data["finish_reason"] = self.finish_reason
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> ChoiceDelta:
        logprobs = data.get("logprobs")
        return cls(
            index=int(data["index"]),  # type: ignore[call-overload]
            text=str(data["text"]),
            offset=int(data["offset"]),  # type: ignore[call-overload]
            tokens=int(data["tokens"]),  # type: ignore[call-overload]
            logprobs=None
            if logprobs is None
            else tuple(TokenLogprob.from_dict(lp) for lp in logprobs),  # type: ignore[attr-defined]
            finish_reason=data.get("finish_reason"),  # type: ignore[arg-type]
        )


@dataclass(frozen=True, kw_only=True)
class JobDelta:
    """What one engine step (or several, merged) added to a streamed job."""

    job_id: str
    choices: tuple[ChoiceDelta, ...]


@dataclass(frozen=True, kw_only=True)
class RunStarted:
    """A streamed job entered an engine: the tokens that follow start from the first."""

    job_id: str


TokenEvent = JobDelta | RunStarted


def coalesce(events: Iterable[TokenEvent]) -> list[TokenEvent]:
    """The same events with each job's consecutive deltas merged (a choice's text joined),
    so a writer that fell behind catches up in one entry per job. Order within a job is
    kept; a `RunStarted` is never merged across."""
    out: list[TokenEvent] = []
    open_delta: dict[str, int] = {}  # job id -> index in `out` of its last, open delta
    for event in events:
        if isinstance(event, RunStarted):
            open_delta.pop(event.job_id, None)
            out.append(event)
            continue
        at = open_delta.get(event.job_id)
        if at is None:
            open_delta[event.job_id] = len(out)
            out.append(event)
            continue
        earlier = out[at]
        assert isinstance(earlier, JobDelta)
        out[at] = JobDelta(job_id=event.job_id, choices=_merge(earlier.choices, event.choices))
    return out


def _merge(first: Sequence[ChoiceDelta], second: Sequence[ChoiceDelta]) -> tuple[ChoiceDelta, ...]:
    by_index = {c.index: c for c in first}
    for choice in second:
        earlier = by_index.get(choice.index)
        by_index[choice.index] = choice if earlier is None else earlier.then(choice)
    return tuple(by_index[i] for i in sorted(by_index))


def decode_entry(fields: Mapping[bytes, bytes]) -> list[ChoiceDelta] | None:
    """The choice deltas a stream entry carries; None for the start of a run."""
    if _START in fields:
        return None
    return [ChoiceDelta.from_dict(c) for c in json.loads(fields[_DELTA])]


class TokenStreamWriter:
    """Appends token events to their jobs' streams (the worker's side)."""

    def __init__(self, redis: Redis, *, key_prefix: str, max_entries: int, ttl_s: int) -> None:
        self._redis = redis
        self._key_prefix = key_prefix
        self._max_entries = max_entries
        self._ttl_s = ttl_s

    def write(self, events: Sequence[TokenEvent]) -> None:
        """Every event in one round trip. Redis errors are logged, never raised: readers
        take what they miss from the stored result."""
        if not events:
            return
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                touched: set[str] = set()
                for event in events:
                    key = tokens_key(self._key_prefix, event.job_id)
                    if isinstance(event, RunStarted):
                        fields = {_START: b""}
                    else:
                        payload = json.dumps(
                            [c.to_dict() for c in event.choices], separators=(",", ":")
                        )
                        fields = {_DELTA: payload.encode()}
                    pipe.xadd(key, fields, maxlen=self._max_entries, approximate=True)  # type: ignore[arg-type]
                    touched.add(key)
                for key in touched:
                    pipe.expire(key, self._ttl_s)
                pipe.execute()
        except RedisError as exc:
            log.warning("could not write tokens of %d events: %s", len(events), exc)
