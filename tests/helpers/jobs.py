"""Jobs and results as the worker hands them to the store, and jobs written as the API
submits them, for store tests."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from inferq.domain.jobs import Choice, Job, JobResult, JobSpec, JobStatus, SamplingParams
from inferq.domain.webhooks import WebhookRequest
from inferq.store.jobs import JobStore, NewJob


def job_spec(prompt: str = "hi") -> JobSpec:
    return JobSpec(
        model="tiny",
        prompt=prompt,
        messages=None,
        prompt_token_ids=[0, 5, 6],
        sampling=SamplingParams(max_tokens=8),
    )


def running_job(job_id: str, *, stream: bool = False) -> Job:
    """A running job as the API reads it back, for tests of waiting and following."""
    return Job(
        id=job_id,
        tenant="t",
        status=JobStatus.RUNNING,
        model="m",
        prompt="p",
        messages=None,
        sampling=SamplingParams(max_tokens=16),
        metadata={},
        prompt_tokens=3,
        created_at=datetime.now(UTC),
        stream=stream,
    )


def job_result(text: str = "out", *, completion_tokens: int = 2) -> JobResult:
    return JobResult(
        choices=(
            Choice(index=0, text=text, finish_reason="stop", completion_tokens=completion_tokens),
        ),
        prompt_tokens=3,
    )


def create_jobs(
    store: JobStore,
    specs: Sequence[JobSpec],
    *,
    tenant: str = "t",
    queue: str,
    requeue_after_s: int = 60,
    webhook: WebhookRequest | None = None,
) -> list[Job]:
    """Queued jobs of one tenant on one queue, submitted together (as the API does)."""
    return store.submit_jobs(
        [NewJob(spec=spec, tenant=tenant, webhook=webhook) for spec in specs],
        queue=queue,
        requeue_after_s=requeue_after_s,
    )
