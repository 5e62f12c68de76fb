"""Text with NUL (U+0000), which vLLM and OpenAI accept and prompts of random tokens often
contain, goes in and comes back byte for byte through the real pieces: API, Redis, the GPU
worker (vLLM on CPU) and Postgres, whose text cannot hold it (inferq.store.text_codec). The
structured-output choice makes the random model write a NUL of its own."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferq.store.text_codec import ESCAPE
from tests.conftest import MODEL_NAME, Stack
from tests.integration.api.test_batches import chat_line, client_for, read_lines, upload, wait_for

pytestmark = pytest.mark.engine

# With the escape character itself, which must come back as it went in too.
ANSWER = f"x\x00y{ESCAPE}0"
FORCED: dict[str, Any] = {"structured_outputs": {"choice": [ANSWER]}}


def test_a_job_takes_nul_everywhere_and_gives_back_its_output_exactly(stack: Stack) -> None:
    with stack.client() as client:
        submitted = client.post(
            "/v1/jobs",
            json={
                "prompt": "a\x00b\x00",
                "max_tokens": 16,
                "stop": ["\x00zz"],
                "metadata": {"k\x00": f"v\x00{ESCAPE}"},
                **FORCED,
            },
        )
        assert submitted.status_code == 202, submitted.text
        job = client.get(f"/v1/jobs/{submitted.json()['id']}", params={"wait": 60}).json()
    assert job["status"] == "succeeded", job
    assert job["choices"][0]["text"] == ANSWER
    assert job["metadata"] == {"k\x00": f"v\x00{ESCAPE}"}
    assert job["params"]["stop"] == ["\x00zz"]
    assert job["params"]["structured"] == {"choice": [ANSWER]}


def test_online_chats_streamed_and_not_take_and_give_nul(stack: Stack) -> None:
    client = client_for(stack)
    messages: Any = [{"role": "user", "content": "a\x00b"}]
    plain = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=16, extra_body=FORCED
    )
    assert plain.choices[0].message.content == ANSWER
    stream = client.chat.completions.create(
        model=MODEL_NAME, messages=messages, max_tokens=16, stream=True, extra_body=FORCED
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert streamed == ANSWER


def test_a_batch_line_with_nul_in_its_custom_id_and_messages_comes_back_exactly(
    stack: Stack,
) -> None:
    client = client_for(stack)
    line = chat_line(0, messages=[{"role": "user", "content": "a\x00b"}], max_tokens=16, **FORCED)
    line["custom_id"] = f"line\x00{ESCAPE}1"
    batch = client.batches.create(
        input_file_id=upload(client, [line, chat_line(1)]),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    batch = wait_for(client, batch.id)
    assert batch.status == "completed", batch
    first, second = read_lines(client, batch.output_file_id)
    assert first["custom_id"] == f"line\x00{ESCAPE}1"
    assert first["response"]["body"]["choices"][0]["message"]["content"] == ANSWER
    assert second["custom_id"] == "req-1"


def test_a_file_name_with_a_raw_nul_is_kept(stack: Stack) -> None:
    """The `openai` client (httpx) sends NUL in a file name as %00; other clients send the
    byte itself."""
    body = (
        b"--b\r\n"
        b'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b"--b\r\n"
        b'Content-Disposition: form-data; name="file"; filename="nul\x00.jsonl"\r\n'
        b"Content-Type: application/jsonl\r\n\r\n"
        + json.dumps(chat_line(0)).encode()
        + b"\r\n--b--\r\n"
    )
    with stack.client() as client:
        uploaded = client.post(
            "/v1/files", content=body, headers={"Content-Type": "multipart/form-data; boundary=b"}
        )
        assert uploaded.status_code == 200, uploaded.text
        read = client.get(f"/v1/files/{uploaded.json()['id']}")
        download = client.get(f"/v1/files/{uploaded.json()['id']}/content")
    assert read.json()["filename"] == "nul\x00.jsonl"
    assert download.status_code == 200
    assert download.headers["Content-Disposition"] == (
        "attachment; filename=\"nul_.jsonl\"; filename*=utf-8''nul%00.jsonl"
    )
