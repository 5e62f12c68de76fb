"""OpenAI's Batch API, driven by the official `openai` client against a running inferq
(API, GPU worker with vLLM on CPU, maintenance worker, beat, Redis, Postgres)."""

from __future__ import annotations

import io
import json
import time
from email.message import Message
from email.utils import collapse_rfc2231_value
from typing import Any

import pytest
from openai import APIStatusError, ConflictError, NotFoundError, OpenAI, UnprocessableEntityError
from openai.types import Batch
from sqlalchemy import select

from inferq.store.models import JobRow
from tests.conftest import ADMIN_KEY, Stack
from tests.helpers.broker import Broker
from tests.helpers.metrics import Delta, engine_settled, worker_idle
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine

TERMINAL = {"completed", "failed", "expired", "cancelled"}
ABORTED = {"outcome": "aborted", "reason": "cancelled"}


def client_for(stack: Stack, key: str = ADMIN_KEY) -> OpenAI:
    return OpenAI(base_url=stack.url + "/v1", api_key=key, max_retries=0, timeout=120)


def chat_line(i: int, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": f"req-{i}",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": "tiny",
            "messages": [{"role": "user", "content": f"Hello number {i}"}],
            "max_tokens": 8,
            **body,
        },
    }


def upload(client: OpenAI, lines: list[Any], name: str = "input.jsonl") -> str:
    raw = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    return client.files.create(file=(name, io.BytesIO(raw.encode())), purpose="batch").id


def wait_for(client: OpenAI, batch_id: str, timeout_s: float = 300) -> Batch:
    deadline = time.monotonic() + timeout_s
    batch = client.batches.retrieve(batch_id)
    while batch.status not in TERMINAL or (
        batch.status != "failed" and batch.output_file_id is None and batch.error_file_id is None
    ):
        assert time.monotonic() < deadline, f"batch still {batch.status}"
        time.sleep(0.5)
        batch = client.batches.retrieve(batch_id)
    return batch


def read_lines(client: OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_chat_batch_runs_to_completion_with_outputs_in_input_order(stack: Stack) -> None:
    client = client_for(stack)
    file_id = upload(client, [chat_line(i, seed=i) for i in range(25)])
    uploaded = client.files.retrieve(file_id)
    assert (uploaded.purpose, uploaded.filename, uploaded.status) == (
        "batch",
        "input.jsonl",
        "processed",
    )
    created = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"run": "nightly"},
    )
    assert created.status in {"in_progress", "finalizing", "completed"}
    assert created.request_counts.total == 25
    # A line is a job: a long-poll on it hears its end (announced on its batch's channel).
    with stack.client() as http:
        lines = http.get("/v1/jobs", params={"batch_id": created.id, "limit": 100}).json()
        last = next(job for job in lines["data"] if job["custom_id"] == "req-24")
        waited = http.get(f"/v1/jobs/{last['id']}", params={"wait": 60}, timeout=90).json()
        assert waited["status"] == "succeeded"
        assert http.get(f"/v1/jobs/{last['id']}").json() == waited
    batch = wait_for(client, created.id)

    assert batch.status == "completed"
    assert (
        batch.request_counts.total,
        batch.request_counts.completed,
        batch.request_counts.failed,
    ) == (25, 25, 0)
    assert batch.metadata == {"run": "nightly"}
    assert batch.in_progress_at is not None
    assert batch.completed_at is not None
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.error_file_id is None
    output = read_lines(client, batch.output_file_id)
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(25)]
    first = output[0]
    body = first["response"]["body"]
    assert first["error"] is None
    assert first["response"]["status_code"] == 200
    assert body["object"] == "chat.completion"
    assert body["model"] == "tiny"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(body["choices"][0]["message"]["content"], str)
    assert (
        body["usage"]["total_tokens"]
        == body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
    )
    assert batch.usage is not None
    assert batch.usage.output_tokens == sum(
        line["response"]["body"]["usage"]["completion_tokens"] for line in output
    )
    out_file = client.files.retrieve(batch.output_file_id)
    assert out_file.bytes == len(client.files.content(batch.output_file_id).content)


def test_a_completions_batch_with_logprobs(stack: Stack) -> None:
    client = client_for(stack)
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/completions",
            "body": {
                "model": "tiny",
                "prompt": f"Count {i}",
                "max_tokens": 4,
                "logprobs": 2,
                "ignore_eos": True,
            },
        }
        for i in range(5)
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/completions", completion_window="24h"
    )
    batch = wait_for(client, batch.id)
    [first, *_] = read_lines(client, batch.output_file_id)
    choice = first["response"]["body"]["choices"][0]
    assert first["response"]["body"]["object"] == "text_completion"
    assert len(choice["logprobs"]["tokens"]) == 4
    assert all(len(top) <= 2 for top in choice["logprobs"]["top_logprobs"])
    # Offsets follow the tokens (a byte-level token may be half a character, so the joined
    # tokens need not spell the detokenized text exactly).
    lengths = [len(token) for token in choice["logprobs"]["tokens"]]
    assert choice["logprobs"]["text_offset"] == [sum(lengths[:i]) for i in range(4)]
    assert all(lp <= 0 for lp in choice["logprobs"]["token_logprobs"])


BAD_LINES = [
    ("not json at all", "invalid_json_line", None, "not valid JSON"),
    (
        {"method": "POST", "url": "/v1/chat/completions", "body": {}},
        "missing_required_parameter",
        "custom_id",
        "custom_id is required",
    ),
    ({**chat_line(0), "custom_id": "req-0"}, "duplicate_custom_id", "custom_id", "appears earlier"),
    ({**chat_line(3), "url": "/v1/completions"}, "mismatched_url", "url", "this batch's endpoint"),
    (chat_line(4, stream=True), "stream_not_supported", "body.stream", "stream must be false"),
    (chat_line(5, model="gpt-4o"), "model_not_found", "body.model", "not served here"),
    (
        chat_line(6, messages=[{"role": "user", "content": "hi " * 3000}]),
        "context_length_exceeded",
        "body.messages",
        "context of 1024 tokens",
    ),
    (
        chat_line(7, temperature=5),
        "invalid_parameter",
        "body.temperature",
        "less than or equal to 2",
    ),
    (
        chat_line(8, max_tokens=0),
        "invalid_parameter",
        "body.max_tokens",
        "greater than or equal to 1",
    ),
    (
        chat_line(9, logit_bias={"17000": -100}),
        "invalid_parameter",
        "body.logit_bias",
        "outside this model's vocabulary",
    ),
]


def test_every_invalid_line_is_reported_with_its_number_and_nothing_runs(stack: Stack) -> None:
    client = client_for(stack)
    lines: list[Any] = [chat_line(0)]
    lines += [line for line, *_ in BAD_LINES]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    assert batch.status == "failed"
    assert batch.failed_at is not None
    assert batch.request_counts.total == 0  # no job was written
    errors = {e.line: e for e in batch.errors.data}
    for number, (_, code, param, message) in enumerate(BAD_LINES, start=2):
        error = errors[number]
        assert error.code == code, error
        assert error.param == param, error
        assert message in error.message, error
        assert error.message.startswith(f"line {number}")
    assert "(custom_id 'req-7')" in errors[9].message
    assert 1 not in errors


def test_limits_and_malformed_files_are_refused_clearly(stack: Stack) -> None:
    client = client_for(stack)
    with pytest.raises(UnprocessableEntityError, match="not valid UTF-8"):
        client.files.create(file=("x.jsonl", io.BytesIO(b'{"a": "\xff\xfe"}\n')), purpose="batch")
    with pytest.raises(UnprocessableEntityError, match="empty"):
        client.files.create(file=("x.jsonl", io.BytesIO(b"")), purpose="batch")
    with pytest.raises(UnprocessableEntityError, match="purpose must be 'batch'"):
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    with pytest.raises(APIStatusError, match="over the limit") as too_big:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (9 << 20))), purpose="batch")
    assert too_big.value.status_code == 413
    too_many = upload(client, [chat_line(i) for i in range(5001)])
    batch = client.batches.create(
        input_file_id=too_many, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert batch.status == "failed"
    [error] = batch.errors.data
    assert error.code == "too_many_lines"
    assert "5001 lines, over the limit of 5000" in error.message
    with pytest.raises(UnprocessableEntityError, match="completion_window"):
        client.batches.create(
            input_file_id=too_many, endpoint="/v1/chat/completions", completion_window="soon"
        )
    with pytest.raises(UnprocessableEntityError, match="no file"):
        client.batches.create(
            input_file_id="file-missing", endpoint="/v1/chat/completions", completion_window="24h"
        )


def test_thousands_of_lines_complete_with_counts_that_add_up(stack: Stack) -> None:
    client = client_for(stack)
    lines = [chat_line(i, max_tokens=4, ignore_eos=True) for i in range(3000)]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch = wait_for(client, batch.id, timeout_s=600)
    counts = batch.request_counts
    assert batch.status == "completed"
    assert counts.total == 3000
    assert counts.completed + counts.failed == counts.total
    output = read_lines(client, batch.output_file_id)
    assert len(output) == counts.completed
    assert [line["custom_id"] for line in output] == [f"req-{i}" for i in range(3000)][
        : len(output)
    ]
    assert batch.usage.output_tokens == 4 * counts.completed


def test_cancel_keeps_finished_lines_and_never_runs_the_rest(stack: Stack, broker: Broker) -> None:
    client = client_for(stack)
    # Counted from an idle worker: what entered its engine from here on is this test's.
    wait_until(lambda: worker_idle(stack.worker.metrics_url), timeout_s=60, what="idle")
    engine = Delta(stack.worker.metrics_url)
    # Three short lines, then long ones: once the short ones are done the engine is full of
    # long lines, a few more wait for it, and the rest are still in Redis. The long lines
    # run to near the context (1024 tokens) so none can finish (and free a slot) before the
    # cancel reaches the worker, however long the poll below takes; the cancel aborts them,
    # so their length costs no time.
    lines = [chat_line(i, max_tokens=4 if i < 3 else 900, ignore_eos=True) for i in range(200)]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    wait_until(
        lambda: client.batches.retrieve(batch.id).request_counts.completed >= 3,
        timeout_s=120,
        what="three lines completed",
    )
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in {"cancelling", "cancelled"}
    batch = wait_for(client, batch.id)
    # The worker has been through every message of the batch (taking nothing, if the
    # cancel held), and whatever it put into its engine has left it.
    with stack.sessions() as session:
        line_ids = set(session.scalars(select(JobRow.id).where(JobRow.batch_id == batch.id)))
    broker.wait_gpu_messages_done(line_ids, timeout_s=120)
    wait_until(lambda: engine_settled(engine), timeout_s=60, what="the engine empty")

    assert batch.status == "cancelled"
    assert batch.cancelling_at is not None
    assert batch.cancelled_at is not None
    counts = batch.request_counts
    assert counts.completed >= 3
    assert counts.completed + counts.failed == counts.total == 200
    output = read_lines(client, batch.output_file_id)
    errors = read_lines(client, batch.error_file_id)
    assert len(output) == counts.completed
    assert len(errors) == counts.failed
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    assert sorted(line["custom_id"] for line in output + errors) == sorted(
        f"req-{i}" for i in range(200)
    )
    # Most cancelled lines were never even claimed by a worker.
    with stack.sessions() as session:
        attempts = session.scalars(
            select(JobRow.attempts).where(JobRow.batch_id == batch.id, JobRow.status == "cancelled")
        ).all()
    assert len(attempts) == counts.failed
    assert attempts.count(0) > counts.failed / 2
    # The store keeps no late result, so only the worker can tell whether the rest ran:
    # beyond the lines kept, only those in its engine when the cancel came entered it
    # (none of the lines it held waiting for room, none of those still in Redis).
    in_engine = int(stack.env["INFERQ_MAX_NUM_SEQS"])
    assert engine("inferq_jobs_admitted_total") <= counts.completed + in_engine
    succeeded = engine("inferq_jobs_finished_total", outcome="succeeded", reason="length")
    assert counts.completed <= succeeded <= counts.completed + in_engine
    with pytest.raises(ConflictError, match="only a batch in progress"):
        client.batches.cancel(batch.id)


def test_a_batch_past_its_window_expires_keeping_what_finished(stack: Stack) -> None:
    client = client_for(stack)
    lines = [chat_line(i, max_tokens=400, ignore_eos=True) for i in range(150)]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/chat/completions", completion_window="5s"
    )
    batch = wait_for(client, batch.id)
    assert batch.status == "expired"
    assert batch.expired_at is not None
    counts = batch.request_counts
    assert counts.completed + counts.failed == counts.total == 150
    assert counts.failed > 0
    errors = read_lines(client, batch.error_file_id)
    assert len(errors) == counts.failed
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}
    assert len(read_lines(client, batch.output_file_id)) == counts.completed


def test_files_and_batches_list_page_and_delete(stack: Stack) -> None:
    client = client_for(stack, stack.new_key())
    ids = [upload(client, [chat_line(i)], name=f"f{i}.jsonl") for i in range(3)]
    listed = client.files.list()
    assert [f.id for f in listed.data] == ids[::-1]
    batches = [
        client.batches.create(
            input_file_id=i, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        for i in ids
    ]
    page = client.batches.list(limit=2)
    assert [b.id for b in page.data] == batches[::-1][:2]
    assert page.has_more
    rest = client.batches.list(limit=2, after=page.data[-1].id)
    assert [b.id for b in rest.data] == [batches[0]]
    deleted = client.files.delete(ids[0])
    assert deleted.deleted
    with pytest.raises(NotFoundError):
        client.files.retrieve(ids[0])
    assert wait_for(client, batches[0]).status == "completed"  # its lines were already queued


@pytest.mark.parametrize("name", ["数据.jsonl", "a\\b;c.jsonl", "plain.jsonl"])
def test_a_file_downloads_under_the_name_it_was_uploaded_with(stack: Stack, name: str) -> None:
    client = client_for(stack)
    file_id = upload(client, [chat_line(0)], name=name)
    assert client.files.retrieve(file_id).filename == name
    content = client.files.with_raw_response.content(file_id)
    assert content.status_code == 200
    assert json.loads(content.content) == chat_line(0)
    header = Message()
    header["Content-Disposition"] = content.headers["Content-Disposition"]
    names = [v for k, v in header.get_params(header="content-disposition") or () if k == "filename"]
    # A plain name for every client, and the name itself (`filename*`) for those of RFC 6266.
    assert isinstance(names[0], str)
    assert names[0].isascii()
    assert collapse_rfc2231_value(names[-1]) == name


def test_another_tenant_sees_none_of_it(stack: Stack) -> None:
    owner, stranger = client_for(stack, stack.new_key()), client_for(stack, stack.new_key())
    file_id = upload(owner, [chat_line(0)])
    batch = owner.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait_for(owner, batch.id)
    for call in (
        lambda: stranger.files.retrieve(file_id),
        lambda: stranger.files.content(file_id),
        lambda: stranger.files.content(batch.output_file_id),
        lambda: stranger.files.delete(file_id),
        lambda: stranger.batches.retrieve(batch.id),
        lambda: stranger.batches.cancel(batch.id),
    ):
        with pytest.raises(NotFoundError):
            call()
    with pytest.raises(UnprocessableEntityError, match="no file"):
        stranger.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert stranger.batches.list().data == []
    assert stranger.files.list().data == []


def test_a_retried_batch_creation_creates_one_batch(stack: Stack) -> None:
    client = client_for(stack, stack.new_key())
    file_id = upload(client, [chat_line(0)])
    headers = {"Idempotency-Key": f"batch-{file_id}"}
    first = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers=headers,
    )
    again = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers=headers,
    )
    assert again.id == first.id
    assert [b.id for b in client.batches.list().data] == [first.id]
