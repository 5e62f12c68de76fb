"""Anthropic's Message Batches through the official `anthropic` client, over inferq's
batches on the real stack: create, retrieve, list, cancel and results."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from anthropic.types.messages import MessageBatch

from tests.conftest import MODEL_NAME, Stack
from tests.helpers.waiting import wait_until
from tests.integration.api.conftest import AnthropicClients

pytestmark = pytest.mark.engine


def params(text: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL_NAME,
        "max_tokens": 6,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def ended(client: anthropic.Anthropic, batch_id: str) -> MessageBatch:
    def check() -> MessageBatch | None:
        batch = client.messages.batches.retrieve(batch_id)
        return batch if batch.processing_status == "ended" else None

    batch = wait_until(check, timeout_s=120, what=f"message batch {batch_id} ended")
    assert batch is not None
    return batch


def test_a_message_batch_runs_to_its_results(
    stack: Stack, anthropic_clients: AnthropicClients
) -> None:
    client = anthropic_clients(stack.new_key())
    requests = [
        {"custom_id": "first", "params": params("Tell me about the sea.", system="Be brief.")},
        {"custom_id": "second", "params": params("And the sky?", stop_sequences=["\n\n"])},
        {"custom_id": "third", "params": params("Hello", max_tokens=3, temperature=0)},
    ]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert created.type == "message_batch"
    assert created.processing_status == "in_progress"
    assert created.request_counts.processing == 3
    assert created.results_url is None

    batch = ended(client, created.id)
    assert batch.request_counts.succeeded == 3
    assert batch.request_counts.processing == batch.request_counts.errored == 0
    assert batch.ended_at is not None
    assert batch.ended_at >= batch.created_at
    results = list(client.messages.batches.results(created.id))
    assert [r.custom_id for r in results] == ["first", "second", "third"]
    messages = [r.result.message for r in results if r.result.type == "succeeded"]
    assert len(messages) == 3
    assert messages[2].usage.output_tokens == 3
    assert messages[2].stop_reason == "max_tokens"
    # A line reads as the same request sent online would.
    online = client.messages.create(**params("Tell me about the sea.", system="Be brief."))
    assert messages[0].usage.input_tokens == online.usage.input_tokens

    listed = client.messages.batches.list(limit=10)
    assert [b.id for b in listed.data] == [created.id]
    assert listed.data[0].request_counts.succeeded == 3


def test_a_refused_request_is_named_and_nothing_is_queued(
    stack: Stack, anthropic_clients: AnthropicClients
) -> None:
    client = anthropic_clients(stack.new_key())
    image = {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}
    good = {"custom_id": "good", "params": params("Hi")}
    bad = {
        "custom_id": "bad",
        "params": params("Hi", messages=[{"role": "user", "content": [image]}]),
    }
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        client.messages.batches.create(requests=[good, bad])  # type: ignore[list-item]
    error = refused.value.body["error"]  # type: ignore[index]
    assert error["param"] == "requests.1.params.messages.0.content.0"
    assert "'bad'" in error["message"]
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        client.messages.batches.create(requests=[good, good])  # type: ignore[list-item]
    assert refused.value.body["error"]["param"] == "requests.1.custom_id"  # type: ignore[index]
    # A create may be as large as an uploaded file: this one, over the JSON body limit
    # of other requests, is read, and its prompt found too long for the model.
    long = {"custom_id": "long", "params": params("sea " * 300_000)}
    with pytest.raises(anthropic.UnprocessableEntityError) as refused:
        client.messages.batches.create(requests=[good, long])  # type: ignore[list-item]
    assert refused.value.body["error"]["code"] == "context_length_exceeded"  # type: ignore[index]
    assert refused.value.body["error"]["param"].startswith("requests.1.params.")  # type: ignore[index]
    assert client.messages.batches.list().data == []


def test_a_cancelled_batch_keeps_what_ended_and_cancels_the_rest(
    stack: Stack, anthropic_clients: AnthropicClients
) -> None:
    client = anthropic_clients(stack.new_key())
    long = params("Tell me about the sea.", max_tokens=900, ignore_eos=True)
    requests = [{"custom_id": f"r{i}", "params": long} for i in range(24)]
    created = client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    cancelling = client.messages.batches.cancel(created.id)
    assert cancelling.processing_status in ("canceling", "ended")
    assert cancelling.cancel_initiated_at is not None

    batch = ended(client, created.id)
    counts = batch.request_counts
    assert counts.canceled > 0
    assert counts.succeeded + counts.canceled == 24
    results = list(client.messages.batches.results(created.id))
    kinds = [r.result.type for r in results]
    assert kinds.count("canceled") == counts.canceled
    assert kinds.count("succeeded") == counts.succeeded
    with pytest.raises(anthropic.ConflictError):
        client.messages.batches.cancel(created.id)


def test_a_keys_quota_holds_for_messages_and_message_batches(
    stack: Stack, anthropic_clients: AnthropicClients
) -> None:
    secret = stack.new_key()
    key = stack.keys.find(secret)
    assert key is not None
    with stack.client() as http:
        patched = http.patch(f"/v1/admin/keys/{key.id}", json={"max_queued_tokens": 100})
    assert patched.status_code == 200, patched.text
    client = anthropic_clients(secret)
    # More than the quota can ever hold: a request to change, not to retry.
    with pytest.raises(anthropic.UnprocessableEntityError) as too_much:
        client.messages.create(**params("Hi", max_tokens=200))
    assert "max_queued_tokens" in too_much.value.message
    requests = [{"custom_id": f"r{i}", "params": params("Hi", max_tokens=60)} for i in range(3)]
    # Its requests fit one by one, not together: refused whole, as any batch is.
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.batches.create(requests=requests)  # type: ignore[arg-type]
    assert refused.value.status_code in (422, 429)
    assert "max_queued_tokens" in refused.value.message
    assert client.messages.batches.list().data == []
    assert client.messages.create(**params("Hi", max_tokens=4)).usage.output_tokens == 4
