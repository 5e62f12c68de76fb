"""How clients see jobs and batches: the JSON of the API's responses and of webhook
payloads, kept in one place so the two always say the same. Conversions from the domain are
explicit classmethods; batches use OpenAI's shapes (unix-second timestamps)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from inferq.domain.batches import Batch, BatchStatus
from inferq.domain.estimates import Estimate
from inferq.domain.jobs import Choice, Job, JobStatus
from inferq.wire.embeddings import embedding_vectors
from inferq.wire.openai_format import tool_call


class TopLogprob(BaseModel):
    token: str
    logprob: float


class TokenLogprobPublic(BaseModel):
    token: str
    logprob: float
    top_logprobs: list[TopLogprob]


class PromptLogprobPublic(BaseModel):
    logprob: float
    rank: int | None = Field(description="1 is the most likely token at its position.")
    decoded_token: str | None


class FunctionCallPublic(BaseModel):
    name: str
    arguments: str = Field(description="The call's arguments, as JSON text.")


class ToolCallPublic(BaseModel):
    """A call as OpenAI's chat completions show it."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallPublic


class ChoicePublic(BaseModel):
    index: int
    text: str
    finish_reason: str | None = Field(description="`stop`, `length`, `tool_calls` or `abort`.")
    completion_tokens: int
    logprobs: list[TokenLogprobPublic] | None = None
    tool_calls: list[ToolCallPublic] | None = Field(
        None, description="The functions the model called (chats with `tools`)."
    )
    prompt_logprobs: list[dict[str, PromptLogprobPublic] | None] | None = Field(
        None,
        description="The prompt's logprobs (`prompt_logprobs` asked for; absent otherwise), "
        "as vLLM's server sends them: null for the first token, then each position's "
        "tokens by id (as text), the prompt's own and the most likely.",
        exclude_if=lambda value: value is None,
    )

    @classmethod
    def from_choice(cls, choice: Choice) -> ChoicePublic:
        data = choice.to_dict()
        if "tool_calls" in data:  # in OpenAI's shape, as the chat completion has them
            data["tool_calls"] = [tool_call(call) for call in data["tool_calls"]]
        return cls.model_validate(data)


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class JobErrorPublic(BaseModel):
    code: str
    message: str


class JobPublic(BaseModel):
    """A job: its state, timestamps, and its result or error once it has ended."""

    id: str
    object: Literal["job"] = "job"
    url: str
    status: JobStatus
    model: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    attempts: int = Field(description="Times a worker took the job (more than 1 after a crash).")
    params: dict[str, Any] = Field(description="The sampling parameters in effect.")
    metadata: dict[str, Any]
    priority: int = Field(description="Lower runs first; 0 is the default.")
    stream: bool = Field(description="Whether its tokens are sent on as they are generated.")
    choices: list[ChoicePublic] | None = Field(description="The output, once succeeded.")
    embeddings: list[list[float]] | None = Field(
        None,
        description="An embedding job's vectors, one per input in input order, once it "
        "has succeeded (absent for other jobs).",
        exclude_if=lambda value: value is None,
    )
    usage: Usage | None
    error: JobErrorPublic | None
    batch_id: str | None = Field(None, description="The batch this job is a line of.")
    custom_id: str | None = Field(None, description="That line's custom_id.")

    @classmethod
    def from_job(cls, job: Job) -> JobPublic:
        result = job.result
        usage = None
        if result is not None:
            usage = Usage(
                prompt_tokens=job.prompt_tokens,
                completion_tokens=result.completion_tokens,
                total_tokens=job.prompt_tokens + result.completion_tokens,
            )
        return cls(
            id=job.id,
            url=f"/v1/jobs/{job.id}",
            status=job.status,
            model=job.model,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            attempts=job.attempts,
            params=job.sampling.to_dict(),
            metadata=job.metadata,
            priority=job.priority,
            stream=job.stream,
            choices=None
            if result is None
            else [ChoicePublic.from_choice(c) for c in result.choices],
            embeddings=None
            if result is None or result.embedding is None or job.sampling.pooling is None
            else embedding_vectors(result.embedding, job.sampling.pooling),
            usage=usage,
            error=None if job.error is None else JobErrorPublic(**job.error.to_dict()),
            batch_id=job.batch_id,
            custom_id=job.custom_id,
        )


class BatchErrorPublic(BaseModel):
    code: str
    line: int | None
    message: str
    param: str | None


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchErrorPublic]


class RequestCountsPublic(BaseModel):
    total: int
    completed: int
    failed: int


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class BatchUsagePublic(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)


# The longest `expires_after` a file or a batch's output may ask for: ten years.
MAX_EXPIRES_AFTER_S = 10 * 365 * 86400


class ExpiresAfter(BaseModel):
    """OpenAI's expiry policy: `seconds` after the object's creation."""

    anchor: Literal["created_at"] = Field(
        description="What `seconds` counts from: the file's creation (for a batch's output, "
        "the output file's)."
    )
    seconds: int = Field(
        ge=1,
        le=MAX_EXPIRES_AFTER_S,
        description="How long it is kept (OpenAI takes 3600 to 2592000; inferq any "
        "positive number up to ten years).",
    )


class BatchEstimatePublic(BaseModel):
    """When a batch is expected to end and what it is expected to cost: from the speed its
    model's workers measured, the work queued before it and its own lines' prompts and
    `max_tokens` (and, once they run, what they generated)."""

    completion_at: int = Field(description="When it is expected to end (unix seconds).")
    earliest_completion_at: int
    latest_completion_at: int = Field(
        description="Were every remaining line to run to its `max_tokens`."
    )
    input_tokens: int = Field(description="Its lines' prompt tokens.")
    output_tokens: int = Field(description="Tokens it is expected to generate, in all.")
    output_tokens_max: int = Field(description="The most it can generate: every `max_tokens`.")
    tokens_per_s: float = Field(description="The rate it is expected to get.")
    tokens_ahead: int = Field(description="Expected work queued before it, in tokens.")
    updated_at: int

    @classmethod
    def from_estimate(cls, estimate: Estimate) -> BatchEstimatePublic:
        return cls(
            completion_at=int(estimate.completion_at.timestamp()),
            earliest_completion_at=int(estimate.earliest_at.timestamp()),
            latest_completion_at=int(estimate.latest_at.timestamp()),
            input_tokens=estimate.input_tokens,
            output_tokens=estimate.output_tokens,
            output_tokens_max=estimate.output_tokens_max,
            tokens_per_s=round(estimate.tokens_per_s, 1),
            tokens_ahead=estimate.tokens_ahead,
            updated_at=int(estimate.made_at.timestamp()),
        )


class BatchPublic(BaseModel):
    """A batch, as OpenAI's Batch API returns it."""

    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    model: str | None
    errors: BatchErrors | None
    input_file_id: str
    completion_window: str
    status: BatchStatus
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCountsPublic
    usage: BatchUsagePublic
    metadata: dict[str, str] | None
    output_expires_after: ExpiresAfter | None = Field(
        None,
        description="How long its lines, results and files are kept once it ends (null: "
        "kept until deleted).",
    )
    priority: int = Field(0, description="inferq's addition: its lines' priority.")
    estimated_completion_at: int | None = Field(
        None,
        description="inferq's addition: when it is expected to end (unix seconds), updated "
        "while it runs; null once it has ended, or while its model's workers have measured "
        "nothing.",
    )
    estimate: BatchEstimatePublic | None = Field(
        None, description="inferq's addition: the estimate, with its interval and tokens."
    )

    @classmethod
    def from_batch(cls, batch: Batch) -> BatchPublic:
        estimate = batch.estimate
        return cls(
            estimated_completion_at=None
            if estimate is None
            else int(estimate.completion_at.timestamp()),
            estimate=None if estimate is None else BatchEstimatePublic.from_estimate(estimate),
            id=batch.id,
            endpoint=batch.endpoint,
            model=batch.model,
            priority=batch.priority,
            errors=BatchErrors(data=[BatchErrorPublic(**e.to_dict()) for e in batch.errors])
            if batch.errors
            else None,
            input_file_id=batch.input_file_id,
            completion_window=batch.completion_window,
            status=batch.status,
            output_file_id=batch.output_file_id,
            error_file_id=batch.error_file_id,
            created_at=int(batch.created_at.timestamp()),
            in_progress_at=_ts(batch.in_progress_at),
            expires_at=_ts(batch.expires_at),
            finalizing_at=_ts(batch.finalizing_at),
            completed_at=_ts(batch.completed_at),
            failed_at=_ts(batch.failed_at),
            expired_at=_ts(batch.expired_at),
            cancelling_at=_ts(batch.cancelling_at),
            cancelled_at=_ts(batch.cancelled_at),
            request_counts=RequestCountsPublic(
                total=batch.counts.total,
                completed=batch.counts.completed,
                failed=batch.counts.failed,
            ),
            usage=BatchUsagePublic(
                input_tokens=batch.usage.input_tokens,
                output_tokens=batch.usage.output_tokens,
                total_tokens=batch.usage.input_tokens + batch.usage.output_tokens,
            ),
            metadata=batch.metadata or None,
            output_expires_after=None
            if batch.output_expires_after_s is None
            else ExpiresAfter(anchor="created_at", seconds=batch.output_expires_after_s),
        )


def _ts(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp())


def job_json(job: Job) -> dict[str, Any]:
    """A job as JSON, as `GET /v1/jobs/{id}` shows it."""
    return JobPublic.from_job(job).model_dump(mode="json")


def batch_json(batch: Batch) -> dict[str, Any]:
    """A batch as JSON, as `GET /v1/batches/{id}` shows it."""
    return BatchPublic.from_batch(batch).model_dump(mode="json")
