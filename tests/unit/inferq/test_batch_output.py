"""Output files: one JSON line per result, whatever characters the model produced."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from inferq.domain.batches import CHAT_ENDPOINT, ResultRow
from inferq.domain.jobs import JobStatus
from inferq.wire.batch_output import render


def test_line_separators_in_generated_text_do_not_split_a_line() -> None:
    text = "a\u2028b\x85c\u2029d\r\ne\x1cf"
    row = ResultRow(
        job_id="job_1",
        line=1,
        custom_id="x",
        model="m",
        status=JobStatus.SUCCEEDED,
        choices=[{"index": 0, "text": text, "finish_reason": "length"}],
        prompt_tokens=3,
        completion_tokens=5,
        error=None,
        finished_at=datetime(2026, 1, 1, tzinfo=UTC),
    )
    content = b"".join(render([row, row], errors=False, endpoint=CHAT_ENDPOINT))
    lines = content.decode().splitlines()
    assert len(lines) == 2
    body = json.loads(lines[0])["response"]["body"]
    assert body["choices"][0]["message"]["content"] == text
    assert body["model"] == "m"
