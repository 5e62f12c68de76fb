"""Job events over Redis pub/sub: "finished" wakes long-polls (and followers of a batch's
output), "cancelled" reaches workers, and "lines queued" wakes every worker of a queue.

A single job's end is published on a channel of its own, heard only by the API processes
with a request waiting on it; batch lines' ends once a write on their batch's channel
(a wait on a line listens there), and a cancel on each job's. Pub/sub is a hint that
saves latency, never the truth: whoever listens also reads Postgres again on a timer. A
single job's success announces what a read of it would tell of its end (`announce_end`),
so its waiter answers without reading the job; an embedding's, a failure's and a
cancel's carry nothing."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from redis import Redis
from redis.exceptions import RedisError

from inferq.constants import (
    BATCH_PROGRESS_CHANNEL,
    JOBS_CANCEL_CHANNEL,
    JOBS_DONE_CHANNEL,
    LINES_QUEUED_CHANNEL,
)
from inferq.domain.jobs import Choice, JobResult

log = logging.getLogger(__name__)


def done_channel(key_prefix: str, job_id: str) -> str:
    """The channel on which `job_id`'s end is announced."""
    return f"{key_prefix}{JOBS_DONE_CHANNEL}:{job_id}"


def batch_progress_channel(key_prefix: str, batch_id: str) -> str:
    """The channel on which lines of `batch_id` ending is announced."""
    return f"{key_prefix}{BATCH_PROGRESS_CHANNEL}:{batch_id}"


def cancel_channel(key_prefix: str) -> str:
    return key_prefix + JOBS_CANCEL_CHANNEL


def lines_channel(key_prefix: str, queue: str) -> str:
    """The channel on which batch lines queued on `queue` are announced."""
    return f"{key_prefix}{LINES_QUEUED_CHANNEL}:{queue}"


def decode_ids(data: bytes | str) -> list[str]:
    ids = json.loads(data)
    return [str(i) for i in ids] if isinstance(ids, list) else []


@dataclass(frozen=True, kw_only=True)
class EndAnnounced:
    """A single job's success as its worker committed it: its choices, when it started
    and ended, and how many times a worker took it."""

    choices: tuple[Choice, ...]
    started_at: datetime
    finished_at: datetime
    attempts: int


def announce_end(
    result: JobResult, *, started_at: datetime, finished_at: datetime, attempts: int
) -> bytes:
    """What a single job's success announces (an embedding's vectors are not sent: b"")."""
    if result.embedding is not None:
        return b""
    return json.dumps(
        {
            "choices": [choice.to_dict() for choice in result.choices],
            "started_at": started_at.isoformat(),
            "finished_at": finished_at.isoformat(),
            "attempts": attempts,
        }
    ).encode()


def end_announced(data: bytes | str) -> EndAnnounced | None:
    """The success an announcement carries, or None if it carries none (or none this
    process can read: its waiter then reads the job)."""
    if not data:
        return None
    try:
        end = json.loads(data)
        return EndAnnounced(
            choices=tuple(Choice.from_dict(choice) for choice in end["choices"]),
            started_at=datetime.fromisoformat(end["started_at"]),
            finished_at=datetime.fromisoformat(end["finished_at"]),
            attempts=int(end["attempts"]),
        )
    except (ValueError, TypeError, KeyError):
        log.debug("an announcement that cannot be read: %r", data[:200])
        return None


class FinishedJobs(Protocol):
    """Who hears that jobs' results are committed: Redis pub/sub, or nobody (`inferq run`)."""

    def finished(
        self,
        job_ids: Sequence[str],
        *,
        batch_ids: Sequence[str] = (),
        results: Mapping[str, bytes] | None = None,
    ) -> None: ...


class JobEvents:
    """Publishes job events; failures are logged, never raised (see the module doc)."""

    def __init__(self, redis: Redis, *, key_prefix: str) -> None:
        self._redis = redis
        self._key_prefix = key_prefix
        self._cancel = cancel_channel(key_prefix)

    def finished(
        self,
        job_ids: Sequence[str],
        *,
        batch_ids: Sequence[str] = (),
        results: Mapping[str, bytes] | None = None,
    ) -> None:
        """Announce each of `job_ids` on its own channel, with its committed success
        where `results` has it (`announce_end`), and each batch whose lines ended
        (`batch_ids`) once on the batch's, all in one round trip."""
        if not job_ids and not batch_ids:
            return
        results = results or {}
        try:
            with self._redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.publish(done_channel(self._key_prefix, job_id), results.get(job_id, b""))
                for batch_id in batch_ids:
                    pipe.publish(batch_progress_channel(self._key_prefix, batch_id), b"")
                pipe.execute()
        except RedisError as exc:
            log.warning(
                "could not announce %d finished jobs and %d batches' lines: %s",
                len(job_ids),
                len(batch_ids),
                exc,
            )

    def lines_queued(self, queue: str) -> None:
        """Tell every worker of `queue` that batch lines wait for it: each looks at once,
        where a Celery message would wake only the one that takes it."""
        try:
            self._redis.publish(lines_channel(self._key_prefix, queue), b"")
        except RedisError as exc:
            log.warning("could not announce lines queued on %s: %s", queue, exc)

    def cancelled(self, job_ids: Sequence[str]) -> None:
        """Tell every worker (one message for all) and wake whoever waits on each job."""
        if not job_ids:
            return
        self._publish(self._cancel, job_ids)
        self.finished(job_ids)

    def _publish(self, channel: str, job_ids: Sequence[str]) -> None:
        try:
            self._redis.publish(channel, json.dumps(list(job_ids)))
        except RedisError as exc:
            log.warning("could not publish %d job events to %s: %s", len(job_ids), channel, exc)
