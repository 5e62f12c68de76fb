"""Reading a batch input file: each line in OpenAI's Batch format, checked and tokenized.

Lines are checked in chunks, so a 50,000-line file takes bounded memory and the tokenizer
sees many prompts per call. Each line names its own model (OpenAI's files name one; here
lines may mix models and adapters), checked against what the workers registered. Every
problem becomes a `LineError` that names the line, its custom_id and the parameter; the
caller decides what a bad line means for the batch.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, ValidationError

from inferq.domain.batches import (
    CHAT_ENDPOINT,
    EMBEDDINGS_ENDPOINT,
    MESSAGES_ENDPOINT,
    RESPONSES_ENDPOINT,
    LineError,
)
from inferq.domain.jobs import JobSpec
from inferq.exceptions import InvalidRequest, ModelNotFound
from inferq.wire.anthropic_bodies import MessagesBody, prepare_messages
from inferq.wire.compat import Lenient
from inferq.wire.embeddings import (
    EmbeddingBody,
    PreparedEmbedding,
    encode_embeddings,
    finish_embedding,
    prepare_embedding,
)
from inferq.wire.model_catalog import ModelCatalog
from inferq.wire.openai_bodies import ChatBody, CompletionBody, prepare_body
from inferq.wire.response_bodies import ResponsesBody
from inferq.wire.responses import finish_response, prepare_response
from inferq.wire.validation import JobValidator, PreparedRequest, check_storable

CHUNK_LINES = 256
# Python's JSON parser recurses once a level and stops near the interpreter's limit.
MAX_JSON_DEPTH = sys.getrecursionlimit()
MAX_CUSTOM_ID_CHARS = 512


class BatchLine(Lenient):
    """One input line: OpenAI's request envelope (other fields ignored, as its body's)."""

    custom_id: str = Field(min_length=1, max_length=MAX_CUSTOM_ID_CHARS)
    method: Literal["POST"]
    url: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineSpec:
    """A valid line, ready to become a job."""

    line: int
    custom_id: str
    spec: JobSpec


@dataclass(frozen=True)
class _Prepared:
    line: int
    custom_id: str
    request: PreparedRequest
    validator: JobValidator


@dataclass(frozen=True)
class _Embedding:
    line: int
    custom_id: str
    request: PreparedEmbedding


_Checked = _Prepared | _Embedding | LineError


class BatchLineReader:
    """Turns the raw lines of a file into `LineSpec`s and `LineError`s, in line order."""

    def __init__(self, models: ModelCatalog, *, endpoint: str) -> None:
        self._models = models
        self._endpoint = endpoint
        bodies: dict[str, type[ChatBody | CompletionBody | ResponsesBody | MessagesBody]] = {
            CHAT_ENDPOINT: ChatBody,
            RESPONSES_ENDPOINT: ResponsesBody,
            MESSAGES_ENDPOINT: MessagesBody,
        }
        self._body_type = bodies.get(endpoint, CompletionBody)
        self._seen: set[str] = set()

    def read(self, lines: Iterable[bytes]) -> Iterator[LineSpec | LineError]:
        chunk: list[_Checked] = []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            chunk.append(self._prepare(number, raw))
            if len(chunk) >= CHUNK_LINES:
                yield from self._finish(chunk)
                chunk = []
        yield from self._finish(chunk)

    def _prepare(self, number: int, raw: bytes) -> _Checked:
        try:
            return self._check(number, raw)
        except _Refused as refused:
            return refused.error

    def _check(self, number: int, raw: bytes) -> _Prepared | _Embedding:
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise _Refused(
                "invalid_json_line", number, None, f"line {number} is not valid JSON: {exc}"
            ) from exc
        except RecursionError as exc:  # valid JSON, but deeper than the parser will go
            raise _Refused(
                "invalid_json_line",
                number,
                None,
                f"line {number} is nested too deeply (over {MAX_JSON_DEPTH} levels) to be "
                "a request",
            ) from exc
        custom_id = data.get("custom_id") if isinstance(data, dict) else None
        where = f"line {number}" + (f" (custom_id {custom_id!r})" if custom_id else "")
        try:
            envelope = BatchLine.model_validate(data)
        except ValidationError as exc:
            raise _Refused.from_validation(exc, where=where, number=number, prefix="") from exc
        if envelope.custom_id in self._seen:
            raise _Refused(
                "duplicate_custom_id",
                number,
                "custom_id",
                f"{where}: custom_id {envelope.custom_id!r} appears earlier in the file; "
                "each line needs its own",
            )
        self._seen.add(envelope.custom_id)
        if envelope.url != self._endpoint:
            raise _Refused(
                "mismatched_url",
                number,
                "url",
                f"{where}: url is {envelope.url!r}, but this batch's endpoint is "
                f"{self._endpoint!r}",
            )
        if self._endpoint == EMBEDDINGS_ENDPOINT:
            return self._embedding(number, envelope, where)
        return self._generation(number, envelope, where)

    def _generation(self, number: int, envelope: BatchLine, where: str) -> _Prepared:
        try:
            body = self._body_type.model_validate(envelope.body)
        except ValidationError as exc:
            raise _Refused.from_validation(exc, where=where, number=number, prefix="body.") from exc
        if body.stream:
            raise _Refused(
                "stream_not_supported", number, "body.stream", f"{where}: stream must be false"
            )
        if isinstance(body, ResponsesBody):
            _check_response_line(body, number, where)
        try:
            check_storable(envelope.custom_id, "custom_id")
            validator = self._models.get(body.model).validator
            if isinstance(body, ResponsesBody):
                if body.service_tier is not None:
                    # Every line runs as batch work, whatever tier it names: its response
                    # says the default one, as OpenAI's batch output does.
                    body = body.model_copy(update={"service_tier": None})
                request = prepare_response(validator, body)
            elif isinstance(body, MessagesBody):
                request = prepare_messages(validator, body)
            else:
                request = prepare_body(validator, body)
            return _Prepared(number, envelope.custom_id, request, validator)
        except (InvalidRequest, ModelNotFound) as exc:
            raise _Refused.from_error(exc, where=where, number=number) from exc

    def _embedding(self, number: int, envelope: BatchLine, where: str) -> _Embedding:
        try:
            body = EmbeddingBody.model_validate(envelope.body)
        except ValidationError as exc:
            raise _Refused.from_validation(exc, where=where, number=number, prefix="body.") from exc
        try:
            check_storable(envelope.custom_id, "custom_id")
            model = self._models.get(body.model, runner="pooling")
            return _Embedding(number, envelope.custom_id, prepare_embedding(body, model))
        except (InvalidRequest, ModelNotFound) as exc:
            raise _Refused.from_error(exc, where=where, number=number) from exc

    def _finish(self, chunk: list[_Checked]) -> Iterator[LineSpec | LineError]:
        token_ids = _encoded([item for item in chunk if isinstance(item, _Prepared)])
        embeddings = [item for item in chunk if isinstance(item, _Embedding)]
        encoded = encode_embeddings([item.request for item in embeddings])
        inputs = {item.line: ids for item, ids in zip(embeddings, encoded, strict=True)}
        for item in chunk:
            if isinstance(item, LineError):
                yield item
            elif isinstance(item, _Embedding):
                finish = functools.partial(finish_embedding, item.request, inputs[item.line])
                yield _finished(item, finish)
            else:
                ids = token_ids[item.line]
                finish = functools.partial(item.validator.finish, item.request, ids)
                if item.request.response is not None:
                    finish = functools.partial(finish_response, item.validator, item.request, ids)
                yield _finished(item, finish)


def _check_response_line(body: ResponsesBody, number: int, where: str) -> None:
    """What a Responses request may ask online but not in a batch line."""
    if body.previous_response_id is not None:
        raise _Refused(
            "unsupported_parameter",
            number,
            "body.previous_response_id",
            f"{where}: previous_response_id is not supported in batch lines: put the "
            "conversation in input",
        )
    if body.background:
        raise _Refused(
            "unsupported_parameter",
            number,
            "body.background",
            f"{where}: background must be false: every batch line runs in the background",
        )


def _finished(item: _Prepared | _Embedding, finish: Callable[[], JobSpec]) -> LineSpec | LineError:
    """The line's job, once its text is tokenized and `finish` checks its length."""
    try:
        spec = finish()
    except InvalidRequest as exc:
        return LineError(
            code=exc.code,
            line=item.line,
            param=f"body.{exc.param}" if exc.param else None,
            message=f"line {item.line} (custom_id {item.custom_id!r}): {exc.message}",
        )
    return LineSpec(item.line, item.custom_id, spec)


def _encoded(prepared: list[_Prepared]) -> dict[int, list[int]]:
    """Token ids of each line, by line number: each model's lines in one call."""
    by_validator: dict[int, list[_Prepared]] = {}
    for item in prepared:
        by_validator.setdefault(id(item.validator), []).append(item)
    ids: dict[int, list[int]] = {}
    for items in by_validator.values():
        encoded = items[0].validator.encode([item.request for item in items])
        ids.update((item.line, token_ids) for item, token_ids in zip(items, encoded, strict=True))
    return ids


class _Refused(Exception):
    """A line refused while it was checked; carries the `LineError` to report."""

    def __init__(self, code: str, line: int, param: str | None, message: str) -> None:
        super().__init__(message)
        self.error = LineError(code=code, line=line, param=param, message=message)

    @classmethod
    def from_error(
        cls, exc: InvalidRequest | ModelNotFound, *, where: str, number: int
    ) -> _Refused:
        param = exc.param if exc.param in ("custom_id", None) else f"body.{exc.param}"
        code = exc.code if exc.code != "invalid_request" else "invalid_parameter"
        return cls(code, number, param, f"{where}: {exc.message}")

    @classmethod
    def from_validation(
        cls, exc: ValidationError, *, where: str, number: int, prefix: str
    ) -> _Refused:
        first = exc.errors()[0]
        param = prefix + ".".join(
            str(p) for p in first.get("loc", ()) if not (isinstance(p, str) and "[" in p)
        )
        kind = first.get("type", "")
        if kind == "missing":
            code, detail = "missing_required_parameter", "is required"
        elif kind == "extra_forbidden":
            code, detail = "unsupported_parameter", "is not supported (remove it)"
        else:
            code, detail = "invalid_parameter", ": " + first.get("msg", "invalid value")
        more = len(exc.errors()) - 1
        also = f" (and {more} more problem{'s' if more > 1 else ''} on this line)" if more else ""
        spacer = "" if detail.startswith(":") else " "
        return cls(code, number, param or None, f"{where}: {param}{spacer}{detail}{also}")
