"""Expiry through the official `openai` client against a running inferq: files'
`expires_after`, batches' `output_expires_after`, the 404 once they pass, and retention
(run by maintenance in the housekeeping worker) deleting what they held. Also the batch
object checked field by field against the client's own types."""

from __future__ import annotations

import io
import json

import pytest
from openai import NotFoundError, UnprocessableEntityError
from openai.types import Batch, FileObject
from sqlalchemy import func, select

from inferq.store.models import BatchRow, FileRow, JobRow
from tests.conftest import Stack
from tests.helpers.waiting import wait_until
from tests.integration.api.test_batches import chat_line, client_for, upload, wait_for

pytestmark = pytest.mark.engine

THIRTY_DAYS = 30 * 86400


def _gone(read: object) -> bool:
    try:
        read()  # type: ignore[operator]
    except NotFoundError:
        return True
    return False


def _rows(stack: Stack, row: type, *where: object) -> int:
    with stack.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(row).where(*where)) or 0)


def test_files_take_expires_after_and_default_to_the_retention(stack: Stack) -> None:
    client = client_for(stack)
    body = json.dumps(chat_line(0)).encode()
    short = client.files.create(
        file=("a.jsonl", io.BytesIO(body)),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    assert short.expires_at == short.created_at + 3600
    default = client.files.create(file=("b.jsonl", io.BytesIO(body)), purpose="batch")
    assert default.expires_at == default.created_at + THIRTY_DAYS
    FileObject.model_validate(client.files.retrieve(short.id).model_dump())

    with pytest.raises(UnprocessableEntityError, match=r"expires_after\[anchor\]"):
        client.files.create(
            file=("c.jsonl", io.BytesIO(body)),
            purpose="batch",
            expires_after={"anchor": "last_active_at", "seconds": 3600},  # type: ignore[typeddict-item]
        )
    with pytest.raises(UnprocessableEntityError, match=r"expires_after\[seconds\]"):
        client.files.create(
            file=("d.jsonl", io.BytesIO(body)),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 0},
        )


def test_a_batch_output_past_its_expiry_answers_404_and_retention_deletes_it(
    stack: Stack,
) -> None:
    client = client_for(stack)
    body = "\n".join(json.dumps(chat_line(i, max_tokens=4)) for i in range(5)).encode()
    source = client.files.create(
        file=("in.jsonl", io.BytesIO(body)),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 10},
    )
    created = client.batches.create(
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 5},
    )
    assert created.model_extra is not None
    assert created.model_extra["output_expires_after"] == {"anchor": "created_at", "seconds": 5}
    batch = wait_for(client, created.id)
    assert batch.status == "completed"
    assert batch.output_file_id is not None
    output = client.files.retrieve(batch.output_file_id)
    assert output.expires_at is not None
    assert output.expires_at - output.created_at == 5

    # Expired things answer 404 like ones that never existed...
    wait_until(
        lambda: _gone(lambda: client.batches.retrieve(batch.id)), timeout_s=30, what="batch 404"
    )
    assert _gone(lambda: client.files.retrieve(output.id))
    assert _gone(lambda: client.files.content(output.id))
    assert batch.id not in {b.id for b in client.batches.list(limit=100).data}
    wait_until(
        lambda: _gone(lambda: client.files.retrieve(source.id)), timeout_s=60, what="input 404"
    )
    # ...and maintenance's retention deletes their rows: lines, results, files, the batch.
    wait_until(
        lambda: (
            _rows(stack, JobRow, JobRow.batch_id == batch.id)
            + _rows(stack, BatchRow, BatchRow.id == batch.id)
            + _rows(stack, FileRow, FileRow.id.in_([source.id, output.id]))
            == 0
        ),
        timeout_s=60,
        what="retention to delete the batch",
    )


def test_the_batch_object_has_every_field_of_openais_type(stack: Stack) -> None:
    client = client_for(stack)
    batch = client.batches.create(
        input_file_id=upload(
            client, [chat_line(i, max_tokens=3, ignore_eos=True) for i in range(4)]
        ),
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "ml"},
    )
    batch = wait_for(client, batch.id)
    raw = client.batches.with_raw_response.retrieve(batch.id).http_response.json()
    assert set(Batch.model_fields) <= set(raw), set(Batch.model_fields) - set(raw)
    typed = Batch.model_validate(raw)
    assert typed.model == "tiny"
    assert typed.request_counts is not None
    assert (typed.request_counts.total, typed.request_counts.completed) == (4, 4)
    assert typed.usage is not None
    assert typed.usage.output_tokens == 12
    assert typed.usage.input_tokens > 0
    assert typed.usage.total_tokens == typed.usage.input_tokens + typed.usage.output_tokens
    assert typed.usage.input_tokens_details.cached_tokens == 0
    assert typed.usage.output_tokens_details.reasoning_tokens == 0
    assert typed.expires_at == typed.created_at + 86400
    assert raw["output_expires_after"] == {"anchor": "created_at", "seconds": THIRTY_DAYS}
    # Listing reads the same counters as retrieving.
    [listed] = [b for b in client.batches.list(limit=100).data if b.id == batch.id]
    assert listed.request_counts == typed.request_counts
    assert listed.usage == typed.usage
