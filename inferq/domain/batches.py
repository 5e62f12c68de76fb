"""The batch domain: files and batches as OpenAI's Batch API defines them. Plain data."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from inferq.domain.estimates import Estimate
from inferq.domain.jobs import JobStatus, SamplingParams
from inferq.exceptions import InvalidRequest

CHAT_ENDPOINT = "/v1/chat/completions"
COMPLETIONS_ENDPOINT = "/v1/completions"
EMBEDDINGS_ENDPOINT = "/v1/embeddings"
RESPONSES_ENDPOINT = "/v1/responses"
ENDPOINTS = (CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, EMBEDDINGS_ENDPOINT, RESPONSES_ENDPOINT)
# Anthropic's Message Batches: each line's body a Messages request. Not an endpoint of
# OpenAI's Batch API: such batches are made at /v1/messages/batches.
MESSAGES_ENDPOINT = "/v1/messages"
FILE_ID_PREFIX = "file-"
BATCH_ID_PREFIX = "batch_"
MAX_COMPLETION_WINDOW = timedelta(days=7)


class FilePurpose(enum.StrEnum):
    """Why a file exists."""

    BATCH = "batch"
    """Uploaded: the input lines of a batch."""
    BATCH_OUTPUT = "batch_output"
    """Made by inferq: a batch's results (or its errors), produced from Postgres on read."""


class BatchStatus(enum.StrEnum):
    """OpenAI's batch lifecycle."""

    VALIDATING = "validating"
    """The input file is being checked."""
    FAILED = "failed"
    """The input file was refused; `errors` says why, line by line. Nothing ran."""
    IN_PROGRESS = "in_progress"
    """Its lines are queued or running."""
    FINALIZING = "finalizing"
    """Every line has ended; the output files are being made."""
    COMPLETED = "completed"
    """Done: see the output and error files."""
    EXPIRED = "expired"
    """The completion window ran out: finished lines are kept, the rest did not run."""
    CANCELLING = "cancelling"
    """Cancel was asked for; running lines are being stopped."""
    CANCELLED = "cancelled"
    """Cancelled: finished lines are kept, the rest did not run."""

    @property
    def is_terminal(self) -> bool:
        return self in {
            BatchStatus.FAILED,
            BatchStatus.COMPLETED,
            BatchStatus.EXPIRED,
            BatchStatus.CANCELLED,
        }


@dataclass(frozen=True, kw_only=True)
class StoredFile:
    id: str
    tenant: str
    purpose: FilePurpose
    filename: str
    # None: a batch's output or error file, not measured yet (see BatchOutput.measured).
    bytes: int | None
    lines: int
    created_at: datetime
    batch_id: str | None = None
    expires_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class LineError:
    """Why one line of an input file was refused."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "line": self.line, "param": self.param}


@dataclass(frozen=True, kw_only=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, kw_only=True)
class BatchUsage:
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class Batch:
    id: str
    tenant: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: datetime
    expires_at: datetime
    metadata: dict[str, str] = field(default_factory=dict)
    errors: tuple[LineError, ...] = ()
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: datetime | None = None
    finalizing_at: datetime | None = None
    completed_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    cancelling_at: datetime | None = None
    cancelled_at: datetime | None = None
    model: str | None = None
    priority: int = 0
    counts: RequestCounts = field(default_factory=RequestCounts)
    usage: BatchUsage = field(default_factory=BatchUsage)
    # How long its output is kept after it ends (None: kept), and until when, once ended.
    output_expires_after_s: int | None = None
    output_expires_at: datetime | None = None
    # When it is expected to end (None: its model's workers have measured nothing yet).
    estimate: Estimate | None = None


@dataclass(frozen=True, kw_only=True)
class FileEstimate:
    """What a batch of a file would hold and when it would end, were it created now; or
    why it would fail (`errors`, the first of `refused` lines)."""

    lines: int
    model: str | None
    estimate: Estimate | None = None
    errors: tuple[LineError, ...] = ()
    refused: int = 0


def max_output_tokens(sampling: SamplingParams) -> int:
    """The most tokens a line can make (an embedding line makes none)."""
    return 0 if sampling.pooling is not None else sampling.max_tokens * sampling.n


@dataclass(frozen=True, kw_only=True)
class ResultRow:
    """What a batch's output or error file says about one line."""

    job_id: str
    line: int
    custom_id: str
    model: str
    status: JobStatus
    choices: list[dict[str, Any]] | None
    prompt_tokens: int
    completion_tokens: int | None
    error: dict[str, str] | None
    finished_at: datetime | None
    # An embedding line's vectors and how it asked for them (SamplingParams.pooling).
    embedding: bytes | None = None
    pooling: dict[str, Any] | None = None
    # A `/v1/responses` line's sampling and what its response echoes (JobSpec.response).
    sampling: dict[str, Any] | None = None
    response: dict[str, Any] | None = None


_WINDOW = re.compile(r"^(\d+)([hms])$")
_UNITS = {"h": "hours", "m": "minutes", "s": "seconds"}


def parse_completion_window(window: str) -> timedelta:
    """`24h` (OpenAI's only value), or hours, minutes or seconds up to 7 days."""
    match = _WINDOW.match(window)
    if match is None:
        raise InvalidRequest(
            f"completion_window {window!r} is not a duration like '24h', '90m' or '30s'",
            param="completion_window",
        )
    span = timedelta(**{_UNITS[match[2]]: int(match[1])})
    if not timedelta(seconds=1) <= span <= MAX_COMPLETION_WINDOW:
        raise InvalidRequest(
            f"completion_window must be between 1s and {MAX_COMPLETION_WINDOW.days * 24}h",
            param="completion_window",
        )
    return span
