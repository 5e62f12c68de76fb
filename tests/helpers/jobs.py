"""Jobs and results as the worker hands them to the store, for store tests."""

from __future__ import annotations

from inferq.domain.jobs import Choice, JobResult, JobSpec, SamplingParams


def job_spec(prompt: str = "hi") -> JobSpec:
    return JobSpec(
        model="tiny",
        prompt=prompt,
        messages=None,
        prompt_token_ids=[0, 5, 6],
        sampling=SamplingParams(max_tokens=8),
    )


def job_result(text: str = "out", *, completion_tokens: int = 2) -> JobResult:
    return JobResult(
        choices=(
            Choice(index=0, text=text, finish_reason="stop", completion_tokens=completion_tokens),
        ),
        prompt_tokens=3,
    )
