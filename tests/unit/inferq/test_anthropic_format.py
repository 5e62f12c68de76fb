"""A message batch's result lines: each line's end told as Anthropic's result types, which
the `anthropic` client parses."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from anthropic.types.messages import MessageBatchIndividualResponse

from inferq.domain.batches import ResultRow
from inferq.domain.jobs import JobStatus
from inferq.wire.anthropic_format import result_line


def row(status: JobStatus, error: dict[str, str] | None = None) -> ResultRow:
    succeeded = status is JobStatus.SUCCEEDED
    return ResultRow(
        job_id="job_1",
        line=1,
        custom_id="c-1",
        model="m",
        status=status,
        choices=[{"index": 0, "text": "hi", "finish_reason": "stop"}] if succeeded else None,
        prompt_tokens=3,
        completion_tokens=1 if succeeded else None,
        error=error,
        finished_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


@pytest.mark.parametrize(
    ("ended", "kind"),
    [
        (row(JobStatus.SUCCEEDED), "succeeded"),
        (row(JobStatus.FAILED, {"code": "engine_error", "message": "boom"}), "errored"),
        (row(JobStatus.CANCELLED, {"code": "batch_cancelled", "message": "x"}), "canceled"),
        (row(JobStatus.CANCELLED, {"code": "batch_expired", "message": "x"}), "expired"),
    ],
)
def test_each_end_is_its_result_type(ended: ResultRow, kind: str) -> None:
    parsed = MessageBatchIndividualResponse.model_validate(result_line(ended))
    assert parsed.custom_id == "c-1"
    assert parsed.result.type == kind
    if parsed.result.type == "succeeded":
        assert parsed.result.message.content[0].text == "hi"  # type: ignore[union-attr]
        assert parsed.result.message.stop_reason == "end_turn"
    if parsed.result.type == "errored":
        assert parsed.result.error.error.message == "boom"


def test_a_line_that_made_a_call_is_a_tool_use_block() -> None:
    called = row(JobStatus.SUCCEEDED)
    call = {"id": "call_1", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    choice = {"index": 0, "text": "", "finish_reason": "tool_calls", "tool_calls": [call]}
    called = dataclasses.replace(called, choices=[choice])
    parsed = MessageBatchIndividualResponse.model_validate(result_line(called))
    assert parsed.result.type == "succeeded"
    message = parsed.result.message
    assert message.stop_reason == "tool_use"
    [use] = message.content
    assert use.type == "tool_use"
    assert (use.id, use.name, use.input) == ("call_1", "get_weather", {"city": "Oslo"})
