"""`/v1/embeddings` and embedding batches through the official `openai` client, on the
deployment serving several models (the tiny model as an embedding model through vLLM's
pooling runner, on the CPU): API, GPU workers, Redis and Postgres, all real processes."""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

import httpx
import numpy as np
import pytest
from openai import BadRequestError, OpenAI, UnprocessableEntityError

from inferq.constants import JOB_ID_HEADER
from inferq.store.api_keys import KeyStore
from inferq.wire.prompts import PromptRenderer
from tests.conftest import ADMIN_KEY
from tests.integration.api.conftest import CHAT_MODEL, EMBEDDING_MODEL, ModelsStack
from tests.integration.api.test_batches import read_lines, upload, wait_for

pytestmark = [pytest.mark.engine, pytest.mark.xdist_group("models_stack")]

TEXTS = ["a", "b b", "The cat sat on the mat.", "a", "Queues keep the engine full."]
# What a vector must match another computed in another batch of the engine by.
ATOL = 1e-5


def openai_client(stack: ModelsStack) -> OpenAI:
    return OpenAI(
        base_url=stack.deployment.url + "/v1", api_key=ADMIN_KEY, max_retries=0, timeout=120
    )


def decoded(embedding: str | list[float]) -> np.ndarray:
    """A vector as an output line holds it: numbers, or base64 of float32 bytes."""
    if isinstance(embedding, str):
        return np.frombuffer(base64.b64decode(embedding), dtype="<f4")
    return np.array(embedding, dtype=np.float32)


def vectors(client: OpenAI, inputs: Any, **kwargs: Any) -> np.ndarray:
    answer = client.embeddings.create(model=EMBEDDING_MODEL, input=inputs, **kwargs)
    assert [item.index for item in answer.data] == list(range(len(answer.data)))
    return np.array([item.embedding for item in answer.data], dtype=np.float32)


def test_embeddings_come_in_input_order_unit_norm_with_usage(
    models_stack: ModelsStack, renderer: PromptRenderer
) -> None:
    client = openai_client(models_stack)
    answer = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS, encoding_format="float")
    assert answer.model == EMBEDDING_MODEL
    assert [item.index for item in answer.data] == list(range(len(TEXTS)))
    found = np.array([item.embedding for item in answer.data], dtype=np.float32)
    np.testing.assert_allclose(np.linalg.norm(found, axis=1), 1.0, atol=1e-4)
    # Identical texts, identical vectors; different texts, different ones.
    np.testing.assert_array_equal(found[0], found[3])
    assert not np.allclose(found[0], found[1], atol=ATOL)
    tokens = sum(len(ids) for ids in renderer.encode_many(TEXTS, add_special_tokens=True))
    assert (answer.usage.prompt_tokens, answer.usage.total_tokens) == (tokens, tokens)
    # Each vector is its own text's, whatever else was in the request.
    for text, vector in zip(TEXTS[:3], found, strict=False):
        np.testing.assert_allclose(
            vectors(client, text, encoding_format="float")[0], vector, atol=ATOL
        )


def test_the_clients_default_base64_gives_the_same_vectors_as_floats(
    models_stack: ModelsStack,
) -> None:
    client = openai_client(models_stack)
    as_floats = vectors(client, TEXTS, encoding_format="float")
    raw = client.embeddings.with_raw_response.create(model=EMBEDDING_MODEL, input=TEXTS)
    assert json.loads(raw.http_request.content)["encoding_format"] == "base64"
    assert isinstance(raw.http_response.json()["data"][0]["embedding"], str)
    decoded = np.array([item.embedding for item in raw.parse().data], dtype=np.float32)
    np.testing.assert_allclose(decoded, as_floats, atol=ATOL)
    # The request was a job like any other: the job API shows its vectors.
    job_id = raw.headers[JOB_ID_HEADER]
    with models_stack.deployment.client() as http:
        job = http.get(f"/v1/jobs/{job_id}").json()
    assert (job["status"], job["model"]) == ("succeeded", EMBEDDING_MODEL)
    np.testing.assert_allclose(np.array(job["embeddings"], dtype=np.float32), decoded, atol=ATOL)


def test_token_ids_embed_as_their_text_does(
    models_stack: ModelsStack, renderer: PromptRenderer
) -> None:
    client = openai_client(models_stack)
    ids = renderer.encode_many(TEXTS, add_special_tokens=True)
    from_texts = vectors(client, TEXTS, encoding_format="float")
    np.testing.assert_allclose(vectors(client, ids), from_texts, atol=ATOL)
    np.testing.assert_allclose(vectors(client, ids[2])[0], from_texts[2], atol=ATOL)


def test_what_the_model_cannot_do_is_refused_naming_it(
    models_stack: ModelsStack, renderer: PromptRenderer
) -> None:
    client = openai_client(models_stack)
    with pytest.raises(UnprocessableEntityError, match="dimensions") as refused:
        client.embeddings.create(model=EMBEDDING_MODEL, input="a", dimensions=8)
    assert refused.value.param == "dimensions"
    too_long = [1] * (renderer.context_len + 1)
    with pytest.raises(UnprocessableEntityError, match="shorten it") as refused:
        client.embeddings.create(model=EMBEDDING_MODEL, input=[[1, 2], too_long])
    assert (refused.value.param, refused.value.code) == ("input.1", "context_length_exceeded")
    with pytest.raises(UnprocessableEntityError, match=r"input\.1 is an empty string"):
        client.embeddings.create(model=EMBEDDING_MODEL, input=["a", ""])


def test_a_model_of_the_other_kind_is_refused_both_ways(models_stack: ModelsStack) -> None:
    client = openai_client(models_stack)
    with pytest.raises((BadRequestError, UnprocessableEntityError), match=CHAT_MODEL) as refused:
        client.embeddings.create(model=CHAT_MODEL, input="a")
    assert "not embeddings" in refused.value.message
    with pytest.raises((BadRequestError, UnprocessableEntityError), match=EMBEDDING_MODEL):
        client.chat.completions.create(
            model=EMBEDDING_MODEL, messages=[{"role": "user", "content": "hi"}]
        )


def test_an_embedding_batch_gives_what_the_endpoint_gives(models_stack: ModelsStack) -> None:
    client = openai_client(models_stack)
    requests: list[dict[str, Any]] = [
        {"model": EMBEDDING_MODEL, "input": TEXTS[0]},
        {"model": EMBEDDING_MODEL, "input": TEXTS[1:4], "encoding_format": "base64"},
        {"model": EMBEDDING_MODEL, "input": [TEXTS[4]], "encoding_format": "float"},
        {"model": EMBEDDING_MODEL, "input": TEXTS[::-1]},
    ]
    lines = [
        {"custom_id": f"e-{i}", "method": "POST", "url": "/v1/embeddings", "body": body}
        for i, body in enumerate(requests)
    ]
    batch = client.batches.create(
        input_file_id=upload(client, lines), endpoint="/v1/embeddings", completion_window="24h"
    )
    batch = wait_for(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (len(lines), 0)
    output = read_lines(client, batch.output_file_id)
    assert [line["custom_id"] for line in output] == [line["custom_id"] for line in lines]
    for line, request in zip(output, requests, strict=True):
        body = line["response"]["body"]
        assert (body["object"], body["model"]) == ("list", EMBEDDING_MODEL)
        online = client.embeddings.create(**request)
        assert body["usage"] == online.usage.model_dump()
        assert [item["index"] for item in body["data"]] == list(range(len(online.data)))
        base64_asked = request.get("encoding_format") == "base64"
        assert all(isinstance(item["embedding"], str) == base64_asked for item in body["data"])
        found = np.array([decoded(item["embedding"]) for item in body["data"]])
        expected = np.array([decoded(item.embedding) for item in online.data])
        np.testing.assert_allclose(found, expected, atol=ATOL)


def test_usage_counts_embedded_tokens_apart_from_generation_by_model(
    models_stack: ModelsStack,
) -> None:
    deployment = models_stack.deployment
    _, secret = KeyStore(deployment.sessions).create(name=f"usage-{secrets.token_hex(3)}")
    client = OpenAI(base_url=deployment.url + "/v1", api_key=secret, max_retries=0, timeout=120)
    embedded = client.embeddings.create(model=EMBEDDING_MODEL, input=TEXTS)
    chat = client.chat.completions.create(
        model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3
    )
    assert chat.usage is not None
    answer = httpx.get(
        deployment.url + "/v1/usage",
        params={"group_by": "model"},
        headers={"Authorization": f"Bearer {secret}"},
    ).json()
    by_model = {r["model"]: r for bucket in answer["data"] for r in bucket["results"]}
    counted = {
        model: (r["input_tokens"], r["output_tokens"], r["embedding_tokens"], r["jobs"])
        for model, r in by_model.items()
    }
    assert counted == {
        EMBEDDING_MODEL: (0, 0, embedded.usage.prompt_tokens, 1),
        CHAT_MODEL: (chat.usage.prompt_tokens, chat.usage.completion_tokens, 0, 1),
    }
