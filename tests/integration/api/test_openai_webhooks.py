"""OpenAI's webhook events: an endpoint that chooses OpenAI's format gets a batch's end as
OpenAI's `batch.*` event, which the `openai` client checks and parses with
`client.webhooks.unwrap`; delivered by the running stack to a real receiver."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from openai import InvalidWebhookSignatureError, OpenAI

from tests.conftest import ADMIN_KEY, MODEL_NAME, Stack
from tests.helpers.receiver import Receiver, receiver
from tests.integration.api.conftest import AnthropicClients

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def hooks() -> Iterator[Receiver]:
    with receiver() as server:
        yield server


def register(stack: Stack, url: str, **extra: Any) -> dict[str, Any]:
    with stack.client() as api:
        response = api.post("/v1/webhook-endpoints", json={"url": url, **extra})
    assert response.status_code == 200, response.text
    return dict(response.json())


def test_a_finished_batch_is_openais_batch_completed_event(stack: Stack, hooks: Receiver) -> None:
    url = hooks.url("/openai-completed")
    endpoint = register(stack, url, format="openai")
    assert endpoint["format"] == "openai"
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 4,
        },
    }
    with OpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY, max_retries=0) as client:
        source = client.files.create(
            file=("in.jsonl", io.BytesIO(json.dumps(line).encode())), purpose="batch"
        )
        batch = client.batches.create(
            input_file_id=source.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            extra_body={"webhook_url": url},
        )
        [received] = hooks.wait_for("/openai-completed", 1)
        assert client.batches.retrieve(batch.id).status == "completed"

    receiving = OpenAI(api_key="unused", webhook_secret=endpoint["secret"])
    event = receiving.webhooks.unwrap(received.body, received.headers)
    assert event.type == "batch.completed"
    assert event.data.id == batch.id
    assert event.id == received.headers["webhook-id"]
    # Another secret's signature is refused.
    forger = OpenAI(api_key="unused", webhook_secret="whsec_" + "QUFBQQ==")
    with pytest.raises(InvalidWebhookSignatureError):
        forger.webhooks.unwrap(received.body, received.headers)
    # Registering it again with the other format turns it back; without one, it stays.
    assert register(stack, url)["format"] == "openai"
    assert register(stack, url, format="inferq")["format"] == "inferq"


def test_a_cancelled_message_batch_is_openais_batch_cancelled_event(
    stack: Stack, hooks: Receiver, anthropic_clients: AnthropicClients
) -> None:
    url = hooks.url("/openai-cancelled")
    endpoint = register(stack, url, format="openai")
    client = anthropic_clients()
    params = {
        "model": MODEL_NAME,
        "max_tokens": 900,
        "messages": [{"role": "user", "content": "Tell me about the sea."}],
        "ignore_eos": True,
    }
    requests = [{"custom_id": f"r{i}", "params": params} for i in range(8)]
    created = client.messages.batches.create(
        requests=requests,  # type: ignore[arg-type]
        extra_body={"webhook_url": url},
    )
    client.messages.batches.cancel(created.id)

    [received] = hooks.wait_for("/openai-cancelled", 1)
    event = OpenAI(api_key="unused", webhook_secret=endpoint["secret"]).webhooks.unwrap(
        received.body, received.headers
    )
    assert event.type == "batch.cancelled"
    assert event.data.id == created.id
    with httpx.Client(base_url=stack.url, headers=stack.headers()) as api:
        [delivery] = api.get("/v1/webhook-deliveries", params={"batch_id": created.id}).json()[
            "data"
        ]
    assert delivery["event"] == "batch.cancelled"
