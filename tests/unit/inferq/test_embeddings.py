"""Embeddings: the request body, the job it becomes (with the tiny model's real tokenizer),
the response rendered from stored vectors, and embedding lines of a batch file."""

from __future__ import annotations

import base64
import dataclasses
import json
import struct
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from inferq.domain.batches import EMBEDDINGS_ENDPOINT, LineError, ResultRow
from inferq.domain.jobs import Job, JobResult, JobStatus, SamplingParams
from inferq.domain.served_models import ServedModel
from inferq.exceptions import InvalidRequest
from inferq.wire.batch_lines import BatchLineReader, LineSpec
from inferq.wire.batch_output import output_line
from inferq.wire.embeddings import (
    MAX_INPUTS,
    EmbeddingBody,
    embedding_body,
    embedding_spec,
    embedding_vectors,
)
from inferq.wire.model_catalog import CatalogModel, FixedModels, ModelCatalog, RequestLimits
from inferq.wire.prompts import PromptRenderer
from inferq.wire.public import job_json
from inferq.wire.validation import JobValidator

EMBEDDER = "embedder"
LIMITS = RequestLimits(default_max_tokens=16, max_n=2, max_tokens_cap=64)


def served(*, supports_dimensions: bool = False, runner: str = "pooling") -> ServedModel:
    return ServedModel(
        name=EMBEDDER if runner == "pooling" else "writer",
        base=EMBEDDER if runner == "pooling" else "writer",
        runner="pooling" if runner == "pooling" else "generate",
        tokenizer="tiny",
        max_model_len=None,
        embedding_size=64 if runner == "pooling" else None,
        supports_dimensions=supports_dimensions,
    )


def catalog_model(renderer: PromptRenderer, **kwargs: Any) -> CatalogModel:
    info = served(**kwargs)
    validator = JobValidator(
        renderer, model_name=info.name, default_max_tokens=16, max_n=2, max_tokens_cap=64
    )
    return CatalogModel(info=info, renderer=renderer, validator=validator)


@pytest.fixture
def model(renderer: PromptRenderer) -> CatalogModel:
    return catalog_model(renderer)


def spec_of(model: CatalogModel, **body: Any):  # type: ignore[no-untyped-def]
    return embedding_spec(EmbeddingBody.model_validate(body), model)


def refusal(**body: Any) -> tuple[tuple[Any, ...], str]:
    with pytest.raises(ValidationError) as refused:
        EmbeddingBody.model_validate(body)
    first = refused.value.errors()[0]
    return first["loc"], first["msg"]


# The body


@pytest.mark.parametrize(
    ("given", "inputs"),
    [
        ("one text", ["one text"]),
        (["a", "b b"], ["a", "b b"]),
        ([5, 6, 7], [[5, 6, 7]]),
        ([[5, 6], [7]], [[5, 6], [7]]),
    ],
)
def test_each_form_of_input_is_a_list_of_inputs(given: Any, inputs: list[Any]) -> None:
    body = EmbeddingBody.model_validate({"model": EMBEDDER, "input": given, "user": "u-1"})
    assert body.inputs() == inputs
    assert (body.encoding_format, body.dimensions) == ("float", None)


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ([], "input is an empty list"),
        ("", "input is an empty string"),
        (["a", "", "c"], "input.1 is an empty string"),
        ([[1], []], "input.1 is an empty token-id list"),
        (["x"] * (MAX_INPUTS + 1), f"over the limit of {MAX_INPUTS}: split them"),
        (5, "input must be a string, a list of strings, a list of token ids"),
        ({"text": "a"}, "input must be a string"),
    ],
)
def test_inputs_that_are_missing_or_too_many_are_refused_saying_what_to_fix(
    given: Any, says: str
) -> None:
    loc, message = refusal(input=given)
    assert loc == ("input",)
    assert says in message


@pytest.mark.parametrize(
    ("given", "loc"),
    [
        ([1, "a"], ("input", "list[int]", 1)),
        (["a", 1], ("input", "list[str]", 1)),
        ([True], ("input", "list[int]", 0)),
        ([[1, 2], [3, 4.5]], ("input", "list[list[int]]", 1, 1)),
    ],
)
def test_a_mixed_or_mistyped_input_is_refused_at_its_item(given: Any, loc: tuple[Any]) -> None:
    # The branch names are left out of error locations: the API says `input.1`.
    assert refusal(input=given)[0] == loc


def test_the_other_fields_are_checked() -> None:
    assert refusal(input="a", dimensions=0)[0] == ("dimensions",)
    assert refusal(input="a", encoding_format="int8")[0] == ("encoding_format",)
    assert refusal(model=EMBEDDER)[0] == ("input",)
    assert refusal(input="a", messages=[])[0] == ("messages",)
    # A field that means nothing to an embedding is ignored, as vLLM's server does.
    assert EmbeddingBody.model_validate({"input": "a", "temperature": 1}).input == "a"


# The job


def test_texts_are_tokenized_with_special_tokens_and_concatenated(
    model: CatalogModel, renderer: PromptRenderer
) -> None:
    texts = ["The cat sat.", "b b", "The cat sat."]
    spec = spec_of(model, input=texts, encoding_format="base64")
    ids = renderer.encode_many(texts, add_special_tokens=True)
    assert ids[0][0] == 0  # <|begin_of_text|>
    assert list(spec.prompt_token_ids) == [t for one in ids for t in one]
    assert spec.sampling.pooling == {
        "input_lengths": [len(one) for one in ids],
        "dimensions": None,
        "encoding_format": "base64",
    }
    assert spec.sampling.max_tokens == 1
    assert (spec.model, spec.base, spec.prompt, spec.messages) == (EMBEDDER, None, None, None)


def test_token_ids_are_taken_as_given(model: CatalogModel) -> None:
    assert spec_of(model, input=[5, 6, 7]).sampling.pooling["input_lengths"] == [3]
    spec = spec_of(model, input=[[5, 6], [7]])
    assert list(spec.prompt_token_ids) == [5, 6, 7]
    assert spec.sampling.pooling["input_lengths"] == [2, 1]


def test_token_ids_outside_the_vocabulary_are_refused_naming_the_input(
    model: CatalogModel, renderer: PromptRenderer
) -> None:
    top = renderer.vocab_size - 1
    assert spec_of(model, input=[[1], [top]]).sampling.pooling["input_lengths"] == [1, 1]
    with pytest.raises(InvalidRequest, match=f"token id {top + 1} .at position 1.") as refused:
        spec_of(model, input=[[1], [2, top + 1]])
    assert refused.value.param == "input.1"
    assert f"ids go from 0 to {top}" in refused.value.message
    with pytest.raises(InvalidRequest, match="token id -1") as refused:
        spec_of(model, input=[3, -1])
    assert refused.value.param == "input"


def test_each_input_must_fit_the_context(model: CatalogModel, renderer: PromptRenderer) -> None:
    context = renderer.context_len
    spec_of(model, input=[[1] * context])
    with pytest.raises(InvalidRequest, match="shorten it") as refused:
        spec_of(model, input=[[1], [1] * (context + 1)])
    assert refused.value.param == "input.1"
    assert refused.value.code == "context_length_exceeded"
    assert f"{context + 1} tokens, over the model's context of {context}" in refused.value.message
    with pytest.raises(InvalidRequest) as refused:
        spec_of(model, input="word " * (context + 10))
    assert refused.value.param == "input"


def test_text_that_is_not_unicode_is_refused_naming_the_input(model: CatalogModel) -> None:
    with pytest.raises(InvalidRequest, match="surrogate") as refused:
        spec_of(model, input=["fine", "bad \ud800"])
    assert refused.value.param == "input.1"
    assert spec_of(model, input="a\x00b").prompt_token_ids  # NUL is text like any other


def test_dimensions_need_a_model_that_can_shorten_its_vectors(
    model: CatalogModel, renderer: PromptRenderer
) -> None:
    with pytest.raises(InvalidRequest, match="cannot shorten its vectors: remove dimensions") as no:
        spec_of(model, input="a", dimensions=16)
    assert no.value.param == "dimensions"
    matryoshka = catalog_model(renderer, supports_dimensions=True)
    assert spec_of(matryoshka, input="a", dimensions=16).sampling.pooling["dimensions"] == 16
    with pytest.raises(InvalidRequest, match="ask for at most 64") as too_many:
        spec_of(matryoshka, input="a", dimensions=65)
    assert too_many.value.param == "dimensions"
    # Announced by a worker still loading it: what it can do is not known yet, so the
    # engine decides (a job it refuses fails with its reason).
    loading = dataclasses.replace(model, info=dataclasses.replace(model.info, embedding_size=None))
    assert spec_of(loading, input="a", dimensions=16).sampling.pooling["dimensions"] == 16


# The response

VECTORS = [[0.5, -0.25, 1.0], [0.125, 2.0, -3.5]]
STORED = b"".join(struct.pack("<3f", *v) for v in VECTORS)


def pooling(encoding_format: str = "float") -> dict[str, Any]:
    return {"input_lengths": [4, 2], "dimensions": None, "encoding_format": encoding_format}


def test_vectors_render_as_numbers_in_input_order_with_usage() -> None:
    body = embedding_body(model=EMBEDDER, embedding=STORED, pooling=pooling(), prompt_tokens=6)
    assert body == {
        "object": "list",
        "data": [
            {"object": "embedding", "index": 0, "embedding": VECTORS[0]},
            {"object": "embedding", "index": 1, "embedding": VECTORS[1]},
        ],
        "model": EMBEDDER,
        "usage": {"prompt_tokens": 6, "total_tokens": 6},
    }


def test_vectors_render_as_base64_of_their_float32_bytes() -> None:
    body = embedding_body(
        model=EMBEDDER, embedding=STORED, pooling=pooling("base64"), prompt_tokens=6
    )
    decoded = [
        np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4").tolist()
        for item in body["data"]
    ]
    assert decoded == VECTORS
    assert [item["index"] for item in body["data"]] == [0, 1]


def test_vectors_that_do_not_split_evenly_are_an_error() -> None:
    with pytest.raises(ValueError, match="do not hold 2 float32 vectors"):
        embedding_vectors(STORED[:-4], pooling())


def test_a_batch_output_line_holds_the_response() -> None:
    row = ResultRow(
        job_id="job_abc",
        line=1,
        custom_id="e-1",
        model=EMBEDDER,
        status=JobStatus.SUCCEEDED,
        choices=[],
        prompt_tokens=6,
        completion_tokens=0,
        error=None,
        finished_at=datetime(2026, 1, 1, tzinfo=UTC),
        embedding=STORED,
        pooling=pooling(),
    )
    line = output_line(row, endpoint=EMBEDDINGS_ENDPOINT)
    assert line["custom_id"] == "e-1"
    body = line["response"]["body"]
    assert [item["embedding"] for item in body["data"]] == VECTORS
    assert (body["model"], body["usage"]["prompt_tokens"]) == (EMBEDDER, 6)


def job(result: JobResult, sampling: SamplingParams) -> Job:
    return Job(
        id="job_1",
        tenant="t",
        status=JobStatus.SUCCEEDED,
        model=EMBEDDER,
        prompt=None,
        messages=None,
        sampling=sampling,
        metadata={},
        prompt_tokens=6,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
        result=result,
    )


def test_the_job_api_shows_an_embedding_jobs_vectors_and_no_other_jobs() -> None:
    embedded = job(
        JobResult(choices=(), prompt_tokens=6, embedding=STORED),
        SamplingParams(max_tokens=1, pooling=pooling("base64")),
    )
    shown = job_json(embedded)
    assert shown["embeddings"] == VECTORS
    assert (shown["choices"], shown["usage"]["prompt_tokens"]) == ([], 6)
    generated = job(JobResult(choices=(), prompt_tokens=6), SamplingParams(max_tokens=4))
    assert "embeddings" not in job_json(generated)


# Batch lines


def reader(renderer: PromptRenderer) -> BatchLineReader:
    models = ModelCatalog(
        FixedModels([served(), served(runner="generate")]),
        limits=LIMITS,
        load=lambda _info: renderer,
    )
    return BatchLineReader(models, endpoint=EMBEDDINGS_ENDPOINT)


def line(custom_id: str, body: dict[str, Any], url: str = EMBEDDINGS_ENDPOINT) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}).encode()


def test_embedding_lines_become_embedding_jobs_or_errors_naming_the_input(
    renderer: PromptRenderer,
) -> None:
    context = renderer.context_len
    lines = [
        line("texts", {"model": EMBEDDER, "input": ["a", "b b"]}),
        line("ids", {"model": EMBEDDER, "input": [[5, 6], [7]], "encoding_format": "base64"}),
        line("long", {"model": EMBEDDER, "input": ["a", "b", [1] * (context + 1)]}),
        line("long-ids", {"model": EMBEDDER, "input": [[1], [1] * (context + 1)]}),
        line("empty", {"model": EMBEDDER, "input": ["a", ""]}),
        line("writer", {"model": "writer", "input": "a"}),
        line("chat", {"model": EMBEDDER, "input": "a", "messages": []}),
        line("url", {"model": EMBEDDER, "input": "a"}, url="/v1/completions"),
    ]
    out = list(reader(renderer).read(lines))
    specs = [item for item in out if isinstance(item, LineSpec)]
    errors = {item.line: item for item in out if isinstance(item, LineError)}
    assert [s.custom_id for s in specs] == ["texts", "ids"]
    texts, ids = (s.spec for s in specs)
    expected = renderer.encode_many(["a", "b b"], add_special_tokens=True)
    assert list(texts.prompt_token_ids) == [t for one in expected for t in one]
    assert texts.model == EMBEDDER
    assert ids.sampling.pooling == {
        "input_lengths": [2, 1],
        "dimensions": None,
        "encoding_format": "base64",
    }
    assert errors[3].param == "body.input.2"  # a mixed list: the third item is not text
    assert errors[4].param == "body.input.1"
    assert errors[4].code == "context_length_exceeded"
    assert "long-ids" in errors[4].message
    assert errors[5].param == "body.input"
    assert "input.1 is an empty string" in errors[5].message
    assert errors[6].param == "body.model"
    assert "serves completions and chats" in errors[6].message
    assert (errors[7].param, errors[7].code) == ("body.messages", "invalid_parameter")
    assert "chat embeddings" in errors[7].message
    assert errors[8].code == "mismatched_url"
