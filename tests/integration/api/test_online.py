"""OpenAI's online endpoints over the queue, streamed and not, through the official `openai`
client (sync and async) and through raw SSE: API, Redis, GPU worker (vLLM on CPU) and
Postgres, all real processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from tests.conftest import ADMIN_KEY, MODEL_NAME, Stack
from tests.helpers.metrics import Samples, scrape, value
from tests.helpers.waiting import wait_until

pytestmark = pytest.mark.engine

CHAT = [{"role": "user", "content": "Tell me about the sea."}]
ABORTED = {"outcome": "aborted", "reason": "cancelled"}


def client_for(stack: Stack) -> OpenAI:
    return OpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=120)


def job_id_of(completion_id: str) -> str:
    return "job_" + completion_id.split("-", 1)[1]


def wait_job(stack: Stack, job_id: str, status: str, timeout_s: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    with stack.client() as client:
        while True:
            job: dict[str, Any] = client.get(f"/v1/jobs/{job_id}", params={"wait": 5}).json()
            if job["status"] == status:
                return job
            assert time.monotonic() < deadline, job
            assert job["status"] in {"queued", "running"}, job


def long_stream(client: OpenAI) -> Any:
    """A streamed chat of eight choices of 900 tokens: seconds of output on the tiny model
    (one choice takes it about a second)."""
    return client.chat.completions.create(
        model=MODEL_NAME,
        messages=CHAT,
        max_tokens=900,
        n=8,
        stream=True,
        extra_body={"ignore_eos": True},
    )


def sse_data(lines: list[str]) -> list[str]:
    """The `data:` payloads of an SSE body; every other non-empty line must be a comment."""
    data = []
    for line in lines:
        if line.startswith("data: "):
            data.append(line.removeprefix("data: "))
        else:
            assert not line or line.startswith(":"), line
    return data


def test_a_streamed_chat_equals_the_same_seeded_chat_unstreamed(stack: Stack) -> None:
    client = client_for(stack)
    params: dict[str, Any] = {
        "model": MODEL_NAME,
        "messages": CHAT,
        "max_tokens": 24,
        "temperature": 0.9,
        "seed": 7,
    }
    whole = client.chat.completions.create(**params)
    chunks = list(
        client.chat.completions.create(
            **params, stream=True, stream_options={"include_usage": True}
        )
    )

    [choice] = whole.choices
    assert whole.object == "chat.completion"
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in {"stop", "length"}
    assert chunks[0].choices[0].delta.role == "assistant"
    content = [c for c in chunks if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in content) == choice.message.content
    assert [c.choices[0].finish_reason for c in content][-1] == choice.finish_reason
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert len({c.id for c in chunks}) == 1
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert whole.usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens
    assert all(c.usage is None for c in chunks[:-1])

    # Each request is a job, listed with the others.
    streamed = wait_job(stack, job_id_of(chunks[0].id), "succeeded")
    assert streamed["stream"] is True
    assert streamed["choices"][0]["text"] == choice.message.content
    stored = wait_job(stack, job_id_of(whole.id), "succeeded")
    assert stored["stream"] is False
    # The unstreamed answer (from the job's announcement, not read back) is what is stored.
    assert stored["choices"][0]["text"] == choice.message.content
    assert stored["choices"][0]["finish_reason"] == choice.finish_reason
    assert stored["usage"]["completion_tokens"] == whole.usage.completion_tokens
    assert stored["usage"]["prompt_tokens"] == whole.usage.prompt_tokens


def test_n_choices_stream_with_their_index_and_logprobs_through_the_async_client(
    stack: Stack,
) -> None:
    params: dict[str, Any] = {
        "model": MODEL_NAME,
        "prompt": "Once upon a time",
        "max_tokens": 16,
        "n": 3,
        "seed": 11,
        "temperature": 1.0,
        "logprobs": 2,
    }

    async def both() -> tuple[Any, list[Any]]:
        client = AsyncOpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY, max_retries=0)
        async with client:
            whole = await client.completions.create(**params)
            stream = await client.completions.create(**params, stream=True)
            return whole, [chunk async for chunk in stream]

    whole, chunks = asyncio.run(both())
    text: dict[int, str] = {}
    tokens: dict[int, list[str]] = {}
    finish: dict[int, str] = {}
    for chunk in chunks:
        assert chunk.object == "text_completion"
        [choice] = chunk.choices
        text[choice.index] = text.get(choice.index, "") + choice.text
        assert choice.logprobs is not None
        tokens.setdefault(choice.index, []).extend(choice.logprobs.tokens)
        if choice.finish_reason is not None:
            finish[choice.index] = choice.finish_reason
    assert sorted(text) == [0, 1, 2]
    for choice in whole.choices:
        assert text[choice.index] == choice.text
        assert tokens[choice.index] == choice.logprobs.tokens
        assert finish[choice.index] == choice.finish_reason


def test_raw_sse_is_openai_chunks_then_done(stack: Stack) -> None:
    body = {"model": MODEL_NAME, "messages": CHAT, "max_tokens": 12, "stream": True}
    with (
        stack.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        job_id = response.headers["inferq-job-id"]
        data = sse_data(list(response.iter_lines()))
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[-1]["choices"][0]["finish_reason"] in {"stop", "length"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert wait_job(stack, job_id, "succeeded")["choices"][0]["text"] == text


def test_a_client_that_hangs_up_mid_stream_cancels_its_request(stack: Stack) -> None:
    before = scrape(stack.worker.metrics_url)
    client = client_for(stack)
    for _ in range(3):
        stream = long_stream(client)
        # The role chunks, then output: hang up once output flows.
        first = next(c for c in stream if c.choices and c.choices[0].delta.content)
        job_id = job_id_of(first.id)
        # The worker (and its engine) frozen while the client hangs up, so the job cannot
        # end meanwhile. On a busy machine the client can fall seconds behind the engine
        # and see its first output after the job ended: that try proves nothing.
        with stack.worker.frozen():
            if _status(stack, job_id) == "running":
                stream.close()
                job = wait_job(stack, job_id, "cancelled")
                break
        stream.close()
    else:
        pytest.fail("in three tries, every job ended before its first output reached the client")
    assert job["choices"] is None
    _wait_aborted(stack, before)


def _status(stack: Stack, job_id: str) -> str:
    with stack.client() as client:
        status: str = client.get(f"/v1/jobs/{job_id}").json()["status"]
        return status


def _wait_aborted(stack: Stack, before: Samples) -> None:
    """Wait until the worker has aborted a job in the engine since `before`, rather than
    left it to generate its 900 tokens a choice."""
    wait_until(
        lambda: (
            value(scrape(stack.worker.metrics_url), "inferq_jobs_finished_total", **ABORTED)
            > value(before, "inferq_jobs_finished_total", **ABORTED)
        ),
        timeout_s=30,
        what="aborted in the engine",
    )


def test_a_client_that_gives_up_waiting_for_an_unstreamed_answer_cancels_it(stack: Stack) -> None:
    before = scrape(stack.worker.metrics_url)
    # Eight choices of 900 tokens: the job runs for hundreds of engine steps.
    body = {
        "model": MODEL_NAME,
        "prompt": "A long story",
        "max_tokens": 900,
        "n": 8,
        "ignore_eos": True,
    }

    async def give_up_once_running() -> str | None:
        async with stack.async_client() as client:
            request = asyncio.create_task(client.post("/v1/completions", json=body))
            # The request never says which job it is before it ends: find it among the jobs.
            while True:
                jobs = (await client.get("/v1/jobs", params={"limit": 1})).json()["data"]
                if request.done() or (jobs and jobs[0]["status"] == "running"):
                    break
                await asyncio.sleep(0.05)
            job_id: str = jobs[0]["id"]
            # The worker (and its engine) frozen while the client hangs up, so the job
            # cannot end meanwhile; if it ended before the freeze (a busy machine), this
            # try proves nothing.
            with stack.worker.frozen():
                if request.done() or await asyncio.to_thread(_status, stack, job_id) != "running":
                    return None
                request.cancel()  # closes the connection: the client hangs up
                with contextlib.suppress(asyncio.CancelledError):
                    await request
                await asyncio.to_thread(wait_job, stack, job_id, "cancelled")
            return job_id

    for _ in range(3):
        if (job_id := asyncio.run(give_up_once_running())) is not None:
            break
    else:
        pytest.fail("in three tries, every job ended before the client could hang up")
    job = wait_job(stack, job_id, "cancelled")
    assert job["params"]["max_tokens"] == 900
    assert job["choices"] is None
    _wait_aborted(stack, before)


def test_an_error_after_the_stream_started_arrives_as_an_event(stack: Stack) -> None:
    client = client_for(stack)
    for _ in range(3):
        stream = long_stream(client)
        job_id = job_id_of(next(iter(stream)).id)  # the stream has started
        # Cancelled with the worker (and its engine) frozen until the cancel has landed,
        # if the job is still running: the tiny model may have written all of its output
        # before a busy machine's client read the first chunk.
        with stack.worker.frozen(), stack.client() as http:
            running = _status(stack, job_id) == "running"
            if running:
                assert http.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
        if running:
            with pytest.raises(openai.APIError, match="cancelled"):
                for _ in stream:
                    pass
            return
        stream.close()
    pytest.fail("in three tries, every job ended before its first output reached the client")


def test_the_role_comes_with_the_first_output_not_while_the_job_is_queued(stack: Stack) -> None:
    body = {"model": MODEL_NAME, "messages": CHAT, "max_tokens": 12, "stream": True}
    arrivals: list[tuple[float, str]] = []
    with stack.client() as client:
        with stack.worker.frozen():
            request = client.build_request("POST", "/v1/chat/completions", json=body)
            response = client.send(request, stream=True)
            job_id = response.headers["inferq-job-id"]

            def read() -> None:
                arrivals.extend((time.monotonic(), line) for line in response.iter_lines())

            reader = threading.Thread(target=read)
            reader.start()
            assert _status(stack, job_id) == "queued"
            # Nothing to wait for: this is the time in which a chunk sent on acceptance
            # (a role while the job is queued) would have arrived.
            time.sleep(1)
            unfrozen = time.monotonic()
        reader.join(60)
        response.close()
    data = [(at, line.removeprefix("data: ")) for at, line in arrivals if line.startswith("data: ")]
    assert data[-1][1] == "[DONE]"
    first_at, first = data[0]
    assert json.loads(first)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first_at > unfrozen, "a chunk was sent while the job waited in the queue"


def test_a_job_can_be_followed_live_and_replayed_after_it_ended(stack: Stack) -> None:
    with stack.client() as client:
        streamed = client.post(
            "/v1/jobs", json={"prompt": "The sea", "max_tokens": 40, "stream": True}
        ).json()
        plain = client.post("/v1/jobs", json={"prompt": "The sea", "max_tokens": 8}).json()

        def follow(job_id: str) -> tuple[str, dict[str, Any]]:
            with client.stream("GET", f"/v1/jobs/{job_id}/stream") as response:
                assert response.status_code == 200
                data = sse_data(list(response.iter_lines()))
            assert data[-1] == "[DONE]"
            events = [json.loads(d) for d in data[:-1]]
            assert {e["object"] for e in events[:-1]} <= {"job.delta"}
            text = "".join(c["text"] for e in events[:-1] for c in e["choices"])
            return text, events[-1]

        live_text, live_end = follow(streamed["id"])
        replay_text, replay_end = follow(streamed["id"])
        plain_text, plain_end = follow(plain["id"])
        missing = client.get("/v1/jobs/job_nope/stream")

    assert live_end["status"] == replay_end["status"] == "succeeded"
    assert live_text == replay_text == live_end["choices"][0]["text"] != ""
    assert plain_end["status"] == "succeeded"
    assert plain_text == plain_end["choices"][0]["text"]
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "not_found_error"


def test_bad_requests_get_openai_errors_naming_the_field(stack: Stack) -> None:
    client = client_for(stack)
    with pytest.raises(openai.UnprocessableEntityError, match="max_tokens") as too_long:
        client.chat.completions.create(
            model=MODEL_NAME, messages=CHAT, max_tokens=10**6, stream=True
        )
    assert too_long.value.body["param"] == "max_tokens"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError, match="not served"):
        client.completions.create(model="gpt-nothing", prompt="hi", max_tokens=4)
    with pytest.raises(openai.UnprocessableEntityError, match="stream_options"):
        client.completions.create(
            model=MODEL_NAME, prompt="hi", max_tokens=4, stream_options={"include_usage": True}
        )
    with httpx.Client(base_url=stack.url) as anonymous:
        refused = anonymous.post(
            "/v1/chat/completions", json={"model": MODEL_NAME, "messages": CHAT}
        )
    assert refused.status_code == 401
