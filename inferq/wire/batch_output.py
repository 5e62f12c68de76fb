"""Output and error files of a batch, line by line, in OpenAI's Batch output format."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import pydantic_core

from inferq.domain.batches import (
    CHAT_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    MESSAGES_ENDPOINT,
    RESPONSES_ENDPOINT,
    ResultRow,
)
from inferq.wire.anthropic_format import result_message
from inferq.wire.embeddings import embedding_body
from inferq.wire.openai_format import completion_body
from inferq.wire.response_objects import ResponseState, response_object


def needs_extras(endpoint: str) -> bool:
    """Whether an endpoint's output lines need more of a job than its choices: an
    embedding's vectors, or what a response echoes."""
    return endpoint in (EMBEDDINGS_ENDPOINT, RESPONSES_ENDPOINT)


def output_line(row: ResultRow, *, endpoint: str) -> dict[str, Any]:
    """A succeeded line: the chat.completion, text_completion, response, list of
    embeddings or (Anthropic's) message a client would get."""
    if endpoint == MESSAGES_ENDPOINT:
        body = result_message(row)
    elif endpoint == RESPONSES_ENDPOINT:
        body = response_object(_response_state(row))
    elif endpoint == EMBEDDINGS_ENDPOINT:
        body = embedding_body(
            model=row.model,
            embedding=row.embedding or b"",
            pooling=row.pooling or {},
            prompt_tokens=row.prompt_tokens,
        )
    else:
        body = completion_body(
            job_id=row.job_id,
            chat=endpoint == CHAT_ENDPOINT,
            created=int(row.finished_at.timestamp()) if row.finished_at else 0,
            model=row.model,
            choices=row.choices or [],
            prompt_tokens=row.prompt_tokens,
            completion_tokens=row.completion_tokens or 0,
        )
    suffix = row.job_id.removeprefix("job_")
    return {
        "id": f"batch_req_{suffix}",
        "custom_id": row.custom_id,
        "response": {"status_code": 200, "request_id": row.job_id, "body": body},
        "error": None,
    }


def _response_state(row: ResultRow) -> ResponseState:
    assert row.finished_at is not None, "a succeeded line has ended"
    return ResponseState(
        job_id=row.job_id,
        status=row.status,
        model=row.model,
        created_at=row.finished_at,
        finished_at=row.finished_at,
        sampling=row.sampling or {},
        echo=row.response or {},
        metadata={},
        choices=row.choices,
        prompt_tokens=row.prompt_tokens,
        completion_tokens=row.completion_tokens,
        error=row.error,
    )


def error_line(row: ResultRow) -> dict[str, Any]:
    """A line that failed, or never ran (the batch was cancelled or expired)."""
    error = row.error or {"code": "cancelled", "message": "the line was cancelled"}
    return {
        "id": f"batch_req_{row.job_id.removeprefix('job_')}",
        "custom_id": row.custom_id,
        "response": None,
        "error": {"code": error["code"], "message": error["message"]},
    }


def render(rows: Iterable[ResultRow], *, errors: bool, endpoint: str) -> Iterator[bytes]:
    """JSON lines, one per row, ready to stream (compact, UTF-8; pydantic-core writes
    them faster than the standard library, infinite logprobs alike)."""
    for row in rows:
        line = error_line(row) if errors else output_line(row, endpoint=endpoint)
        yield _one_line(pydantic_core.to_json(line)) + b"\n"


# Characters JSON leaves raw that many readers take for line ends (Python's
# str.splitlines, JavaScript before ES2019), in UTF-8: escaped, so one result is one line.
_LINE_BREAKERS = (
    ("\x85".encode(), b"\\u0085"),
    ("\u2028".encode(), b"\\u2028"),
    ("\u2029".encode(), b"\\u2029"),
)


def _one_line(encoded: bytes) -> bytes:
    for raw, escaped in _LINE_BREAKERS:
        if raw in encoded:
            encoded = encoded.replace(raw, escaped)
    return encoded
