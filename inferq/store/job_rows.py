"""Job rows and the domain, both ways: the row of a new job (single job or batch line), the
job read back from its row, and the values that end a job."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Text, bindparam, cast, select

from inferq.constants import JOB_ID_PREFIX
from inferq.domain.batches import max_output_tokens
from inferq.domain.jobs import (
    ACTIVE_STATUSES,
    Choice,
    ClaimedJob,
    Job,
    JobError,
    JobOutcome,
    JobResult,
    JobSpec,
    JobStatus,
    SamplingParams,
    pack_token_ids,
    unpack_token_ids,
)
from inferq.ids import new_id
from inferq.store import text_codec
from inferq.store.base import as_utc
from inferq.store.models import JobRow

# The stored statuses of a job that has not ended (queued or running).
ACTIVE = [status.value for status in ACTIVE_STATUSES]


@dataclass(frozen=True)
class BatchPlace:
    """Where a batch line's job belongs: its batch, line and `custom_id`, and the batch's
    priority, which every line runs at."""

    batch_id: str
    line: int
    custom_id: str
    priority: int


def new_job_id() -> str:
    return new_id(JOB_ID_PREFIX)


def new_job_row(
    spec: JobSpec,
    *,
    tenant: str,
    queue: str,
    now: datetime,
    requeue_after_s: int,
    key_id: str | None = None,
    place: BatchPlace | None = None,
    job_id: str | None = None,
) -> dict[str, Any]:
    """The row of a new queued job: a single job, or a batch line (`place`); `key_id` is
    the API key that submitted it; `job_id` its id, if its submitter chose it (else a new
    one)."""
    row = {
        "id": job_id or new_job_id(),
        "tenant": tenant,
        "key_id": key_id,
        "cost_tokens": job_cost(spec),
        "status": JobStatus.QUEUED.value,
        "queue": queue,
        "model": spec.model,
        "prompt": spec.prompt,
        "messages": spec.messages,
        "prompt_token_ids": pack_token_ids(spec.prompt_token_ids),
        "prompt_tokens": len(spec.prompt_token_ids),
        "sampling": spec.sampling.to_dict(),
        "metadata_": spec.metadata,
        "created_at": now,
        # A queued job whose message is lost is published again after this.
        "lease_expires_at": now + timedelta(seconds=requeue_after_s),
        "published_at": now,
        "attempts": 0,
        "priority": spec.priority,
        "stream": spec.stream,
        "response": spec.response,
    }
    if place is not None:
        # A line's metadata is its batch's, kept on the batch.
        row.update(
            metadata_={},
            batch_id=place.batch_id,
            line=place.line,
            custom_id=place.custom_id,
            priority=place.priority,
        )
    return row


def job_cost(spec: JobSpec) -> int:
    """The most tokens a job can use: its prompt, plus `max_tokens` times `n` (what a
    key's quota counts while it is queued or running)."""
    return len(spec.prompt_token_ids) + max_output_tokens(spec.sampling)


def new_job(row: dict[str, Any], spec: JobSpec) -> Job:
    """The job just written as `row` (from `new_job_row(spec, ...)`)."""
    return Job(
        id=row["id"],
        tenant=row["tenant"],
        status=JobStatus.QUEUED,
        model=spec.model,
        prompt=spec.prompt,
        messages=spec.messages,
        sampling=spec.sampling,
        metadata=spec.metadata,
        prompt_tokens=len(spec.prompt_token_ids),
        created_at=row["created_at"],
        priority=spec.priority,
        stream=spec.stream,
        response=spec.response,
    )


# The columns a `Job` is read from (`job_from_row`): not the token ids, lease or queue,
# which only the worker and maintenance need.
JOB_COLUMNS = (
    JobRow.id,
    JobRow.tenant,
    JobRow.status,
    JobRow.model,
    JobRow.prompt,
    JobRow.messages,
    JobRow.sampling,
    JobRow.metadata_.label("metadata_"),
    JobRow.prompt_tokens,
    JobRow.created_at,
    JobRow.attempts,
    JobRow.started_at,
    JobRow.finished_at,
    JobRow.choices,
    JobRow.embedding,
    JobRow.error,
    JobRow.batch_id,
    JobRow.custom_id,
    JobRow.priority,
    JobRow.stream,
    JobRow.response,
)


# Jobs by id (`ids`, a list): built once, as building a statement of twenty columns costs
# more than running it for a few ids.
JOBS_BY_ID = select(*JOB_COLUMNS).where(JobRow.id.in_(bindparam("ids", expanding=True)))
ACTIVE_AMONG = select(JobRow.id).where(
    JobRow.id.in_(bindparam("ids", expanding=True)), JobRow.status.in_(ACTIVE)
)


def job_from_row(row: Any) -> Job:
    """A job from a `JobRow` or a row of `JOB_COLUMNS`."""
    result = None
    if row.choices is not None:
        result = JobResult(
            choices=tuple(Choice.from_dict(c) for c in row.choices),
            prompt_tokens=row.prompt_tokens,
            embedding=row.embedding,
        )
    return Job(
        id=row.id,
        tenant=row.tenant,
        status=JobStatus(row.status),
        model=row.model,
        prompt=row.prompt,
        messages=row.messages,
        sampling=SamplingParams.from_dict(row.sampling),
        metadata=row.metadata_,
        prompt_tokens=row.prompt_tokens,
        created_at=as_utc(row.created_at),
        attempts=row.attempts,
        started_at=as_utc(row.started_at),
        finished_at=as_utc(row.finished_at),
        result=result,
        error=None if row.error is None else JobError(**row.error),
        batch_id=row.batch_id,
        custom_id=row.custom_id,
        priority=row.priority,
        stream=row.stream,
        response=row.response,
    )


# The columns a worker needs of a job it claims (`claimed_job`).
CLAIMED_COLUMNS = (
    JobRow.id,
    JobRow.model,
    JobRow.prompt_token_ids,
    # As stored: the lines of a batch mostly share theirs, each text read once
    # (`_sampling`).
    cast(JobRow.sampling, Text).label("sampling"),
    JobRow.created_at,
    JobRow.batch_id,
    JobRow.priority,
    JobRow.stream,
    JobRow.attempts,
)


def claimed_job(row: Any, now: datetime) -> ClaimedJob:
    """A claimed job from its `CLAIMED_COLUMNS`."""
    return ClaimedJob(
        id=row.id,
        model=row.model,
        prompt_token_ids=unpack_token_ids(row.prompt_token_ids),
        sampling=_sampling(row.sampling),
        created_at=as_utc(row.created_at) or now,
        batch_id=row.batch_id,
        priority=row.priority,
        stream=row.stream,
        attempts=row.attempts,
    )


def outcome_values(outcome: JobOutcome, now: datetime) -> dict[str, Any]:
    """The values that end a job as `outcome` says (keyed by attribute, with its id)."""
    values: dict[str, Any] = {
        "id": outcome.job_id,
        "status": outcome.status.value,
        "finished_at": now,
        "lease_expires_at": None,
    }
    if outcome.started_at is not None:
        values["started_at"] = outcome.started_at
    if outcome.result is not None:
        values["choices"] = [choice.to_dict() for choice in outcome.result.choices]
        values["completion_tokens"] = outcome.result.completion_tokens
        if outcome.result.embedding is not None:
            values["embedding"] = outcome.result.embedding
    if outcome.error is not None:
        values["error"] = outcome.error.to_dict()
    return values


@functools.lru_cache(maxsize=256)
def _sampling(stored: str) -> SamplingParams:
    """Sampling parameters from their stored JSON, one instance for each text: a claim
    of a batch's lines reads the same text for all of them (SamplingParams is frozen)."""
    return SamplingParams.from_dict(text_codec.loads(stored))
