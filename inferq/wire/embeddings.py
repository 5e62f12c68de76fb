"""Embeddings, as OpenAI's `/v1/embeddings` defines them: the request body, the job it
becomes, and the response rendered from the vectors the worker stored.

One request is one job however many inputs it holds: their token ids are concatenated in
the job's prompt and split again by `SamplingParams.pooling["input_lengths"]`, so a job
stays one row, one queue message and one rate-limit charge. The worker stores the vectors
as float32 bytes in input order (`JobResult.embedding`); they are turned into JSON only
when read. Shared by the online endpoint and by batch-file lines.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StrictInt, Tag, field_validator
from pydantic_core import PydanticCustomError

from inferq.domain.jobs import JobSpec, SamplingParams
from inferq.exceptions import InvalidRequest
from inferq.wire.compat import Lenient, ignored, refusing
from inferq.wire.model_catalog import CatalogModel
from inferq.wire.validation import check_storable

# OpenAI's limit on the inputs of one request.
MAX_INPUTS = 2048
FLOAT32_BYTES = 4

EncodingFormat = Literal["float", "base64"]


def _input_kind(value: Any) -> str | None:
    """Which shape of `input` a value is, told by its first item; None: none of them."""
    if isinstance(value, str):
        return "str"
    if not isinstance(value, list):
        return None
    first = value[0] if value else ""
    if isinstance(first, str):
        return "list[str]"
    return "list[list[int]]" if isinstance(first, list) else "list[int]"


# The tags are the names pydantic gives union branches, which error locations leave out.
EmbeddingInput = Annotated[
    Annotated[str, Tag("str")]
    | Annotated[list[str], Tag("list[str]")]
    | Annotated[list[StrictInt], Tag("list[int]")]
    | Annotated[list[list[StrictInt]], Tag("list[list[int]]")],
    Discriminator(
        _input_kind,
        custom_error_type="invalid_input",
        custom_error_message="input must be a string, a list of strings, a list of token "
        "ids or a list of token-id lists",
    ),
]


class EmbeddingBody(Lenient):
    """An embeddings request (OpenAI's shape); fields it does not know are ignored."""

    model: str | None = Field(
        None, description="An embedding model (GET /v1/models); optional if only one is served."
    )
    input: EmbeddingInput = Field(
        description=f"A text, or up to {MAX_INPUTS} texts, or token ids (one list, or a list "
        "of lists): each is embedded on its own, and must fit the model's context."
    )
    encoding_format: EncodingFormat = Field(
        "float",
        description="`float`: lists of numbers; `base64`: each vector's float32 "
        "little-endian bytes, base64-encoded.",
    )
    dimensions: int | None = Field(
        None, ge=1, description="Shorter vectors, for models trained to allow it (Matryoshka)."
    )
    user: str | None = ignored("an end-user id for OpenAI's abuse monitoring.")
    messages: list[Any] | None = refusing(
        "Refused: vLLM's chat embeddings are not served here; send the text as `input`."
    )

    @field_validator("messages")
    @classmethod
    def _no_chat(cls, value: list[Any] | None) -> list[Any] | None:
        if value is not None:
            raise _invalid("messages (chat embeddings) are not supported: send the text as input")
        return value

    @field_validator("input")
    @classmethod
    def _inputs_present(cls, value: str | list[Any]) -> str | list[Any]:
        if isinstance(value, str):
            if not value:
                raise _invalid("input is an empty string: give it some text")
            return value
        if not value:
            raise _invalid("input is an empty list: give at least one text or token id")
        if len(value) > MAX_INPUTS:
            raise _invalid(
                f"input has {len(value)} items, over the limit of {MAX_INPUTS}: split them "
                "over several requests"
            )
        if isinstance(value[0], int):
            return value
        for i, item in enumerate(value):
            if not item:
                kind = "string" if isinstance(item, str) else "token-id list"
                raise _invalid(f"input.{i} is an empty {kind}: remove it or fill it")
        return value

    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs, one item each: texts or token-id lists."""
        value = self.input
        if isinstance(value, str):
            return [value]
        if isinstance(value[0], int):
            return [value]
        return value

    @property
    def size(self) -> int:
        """Characters and token ids in the inputs: how long checking them may take."""
        return sum(len(item) for item in self.inputs())


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_input", message)


@dataclass(frozen=True, kw_only=True)
class PreparedEmbedding:
    """A request past every check that needs no tokenizer: its texts wait to be tokenized."""

    model: CatalogModel
    # Exactly one is set: the texts to tokenize, or the token ids as they were given.
    texts: Sequence[str] | None
    token_ids: Sequence[list[int]] | None
    dimensions: int | None
    encoding_format: EncodingFormat
    # Whether `input` was a list (its items are named `input.3`) or one item (`input`).
    listed: bool

    def param(self, index: int) -> str:
        """The name of one input in errors."""
        return _param(index, listed=self.listed)


def prepare_embedding(body: EmbeddingBody, model: CatalogModel) -> PreparedEmbedding:
    """Every check of an embeddings request but the inputs' lengths in tokens."""
    _check_dimensions(body.dimensions, model)
    inputs = body.inputs()
    listed = not isinstance(body.input, str) and not isinstance(body.input[0], int)
    texts: list[str] | None = None
    token_ids: list[list[int]] | None = None
    if isinstance(inputs[0], str):
        texts = inputs
        for i, text in enumerate(texts):
            check_storable(text, _param(i, listed=listed))
    else:
        token_ids = inputs
        _check_vocabulary(token_ids, model, listed=listed)
    return PreparedEmbedding(
        model=model,
        texts=texts,
        token_ids=token_ids,
        dimensions=body.dimensions,
        encoding_format=body.encoding_format,
        listed=listed,
    )


def _param(index: int, *, listed: bool) -> str:
    return f"input.{index}" if listed else "input"


def _check_dimensions(dimensions: int | None, model: CatalogModel) -> None:
    info = model.info
    if dimensions is None:
        return
    # Both are unknown until a worker has loaded the model (it was announced before):
    # the engine then says whether it can shorten the vectors.
    if not info.supports_dimensions and info.embedding_size is not None:
        raise InvalidRequest(
            f"model {info.name!r} cannot shorten its vectors: remove dimensions (its "
            f"vectors have {info.embedding_size} dimensions)",
            param="dimensions",
        )
    if info.embedding_size is not None and dimensions > info.embedding_size:
        raise InvalidRequest(
            f"dimensions is {dimensions}, over the {info.embedding_size} dimensions of "
            f"model {info.name!r}: ask for at most {info.embedding_size}",
            param="dimensions",
        )


def _check_vocabulary(token_ids: Sequence[list[int]], model: CatalogModel, *, listed: bool) -> None:
    vocab = model.renderer.vocab_size
    for i, ids in enumerate(token_ids):
        low, high = min(ids), max(ids)
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            param = _param(i, listed=listed)
            raise InvalidRequest(
                f"{param} holds token id {bad} (at position {ids.index(bad)}), outside the "
                f"vocabulary of model {model.info.name!r}: ids go from 0 to {vocab - 1}",
                param=param,
            )


def encode_embeddings(prepared: Sequence[PreparedEmbedding]) -> list[list[list[int]]]:
    """Each request's inputs as token ids: the texts of every request for one tokenizer in
    one call (the model's special tokens added, as vLLM does for embeddings)."""
    ids: list[list[list[int]]] = [list(p.token_ids or ()) for p in prepared]
    by_renderer: dict[int, list[int]] = {}
    for i, request in enumerate(prepared):
        if request.texts is not None:
            by_renderer.setdefault(id(request.model.renderer), []).append(i)
    for picked in by_renderer.values():
        renderer = prepared[picked[0]].model.renderer
        texts = [text for i in picked for text in prepared[i].texts or ()]
        encoded = iter(renderer.encode_many(texts, add_special_tokens=True))
        for i in picked:
            ids[i] = [next(encoded) for _ in prepared[i].texts or ()]
    return ids


def finish_embedding(prepared: PreparedEmbedding, inputs: Sequence[list[int]]) -> JobSpec:
    """The job, once the inputs are tokenized and each fits the model's context."""
    context = prepared.model.renderer.context_len
    for i, ids in enumerate(inputs):
        if not ids:
            raise InvalidRequest(
                f"{prepared.param(i)} has no tokens: give it some text", param=prepared.param(i)
            )
        if len(ids) > context:
            raise InvalidRequest(
                f"{prepared.param(i)} is {len(ids)} tokens, over the model's context of "
                f"{context} tokens: shorten it",
                param=prepared.param(i),
                code="context_length_exceeded",
            )
    pooling = {
        "input_lengths": [len(ids) for ids in inputs],
        "dimensions": prepared.dimensions,
        "encoding_format": prepared.encoding_format,
    }
    return JobSpec(
        model=prepared.model.info.name,
        prompt=None,
        messages=None,
        prompt_token_ids=[token for ids in inputs for token in ids],
        sampling=SamplingParams(max_tokens=1, pooling=pooling),
    )


def embedding_spec(body: EmbeddingBody, model: CatalogModel) -> JobSpec:
    """The job for an embeddings request, or `InvalidRequest` naming the field at fault."""
    prepared = prepare_embedding(body, model)
    [inputs] = encode_embeddings([prepared])
    return finish_embedding(prepared, inputs)


def split_vectors(embedding: bytes, inputs: int) -> list[bytes]:
    """A job's stored vectors, one each (they are all the same length)."""
    size, rest = divmod(len(embedding), inputs)
    if rest or size % FLOAT32_BYTES:
        raise ValueError(f"{len(embedding)} bytes do not hold {inputs} float32 vectors")
    return [embedding[i * size : (i + 1) * size] for i in range(inputs)]


def floats(vector: bytes) -> list[float]:
    """A stored vector's numbers."""
    return list(struct.unpack(f"<{len(vector) // FLOAT32_BYTES}f", vector))


def embedding_vectors(embedding: bytes, pooling: Mapping[str, Any]) -> list[list[float]]:
    """Every vector of an embedding job, as numbers, in input order."""
    return [floats(v) for v in split_vectors(embedding, len(pooling["input_lengths"]))]


def embedding_body(
    *, model: str, embedding: bytes, pooling: Mapping[str, Any], prompt_tokens: int
) -> dict[str, Any]:
    """The response a client gets for an embedding job (OpenAI's `list` of `embedding`s),
    its vectors as the request asked: numbers, or base64 of their float32 bytes."""
    encoded = pooling.get("encoding_format") == "base64"
    vectors = split_vectors(embedding, len(pooling["input_lengths"]))
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": base64.b64encode(v).decode("ascii") if encoded else floats(v),
            }
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
