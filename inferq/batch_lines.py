"""Reading a batch input file: each line in OpenAI's Batch format, checked and tokenized.

Lines are checked in chunks, so a 50,000-line file takes bounded memory and the tokenizer
sees many prompts per call. Every problem becomes a `LineError` that names the line, its
custom_id and the parameter; the caller decides what a bad line means for the batch.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferq.batches import CHAT_ENDPOINT, LineError
from inferq.exceptions import InvalidRequest
from inferq.jobs import JobSpec
from inferq.openai_bodies import ChatBody, CompletionBody, prepare_body
from inferq.validation import JobValidator, PreparedRequest, check_storable

CHUNK_LINES = 256
# Python's JSON parser recurses once a level and stops near the interpreter's limit.
MAX_JSON_DEPTH = sys.getrecursionlimit()
MAX_CUSTOM_ID_CHARS = 512


class BatchLine(BaseModel):
    """One input line: OpenAI's request envelope."""

    model_config = ConfigDict(extra="forbid")

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


class BatchLineReader:
    """Turns the raw lines of a file into `LineSpec`s and `LineError`s, in line order."""

    def __init__(self, validator: JobValidator, *, endpoint: str) -> None:
        self._validator = validator
        self._endpoint = endpoint
        self._body_type = ChatBody if endpoint == CHAT_ENDPOINT else CompletionBody
        self._seen: set[str] = set()

    def read(self, lines: Iterable[bytes]) -> Iterator[LineSpec | LineError]:
        chunk: list[_Prepared | LineError] = []
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            chunk.append(self._prepare(number, raw))
            if len(chunk) >= CHUNK_LINES:
                yield from self._finish(chunk)
                chunk = []
        yield from self._finish(chunk)

    def _prepare(self, number: int, raw: bytes) -> _Prepared | LineError:
        try:
            return self._check(number, raw)
        except _Refused as refused:
            return refused.error

    def _check(self, number: int, raw: bytes) -> _Prepared:
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
        try:
            body = self._body_type.model_validate(envelope.body)
        except ValidationError as exc:
            raise _Refused.from_validation(exc, where=where, number=number, prefix="body.") from exc
        if body.stream:
            raise _Refused(
                "stream_not_supported", number, "body.stream", f"{where}: stream must be false"
            )
        try:
            check_storable(envelope.custom_id, "custom_id")
            return _Prepared(number, envelope.custom_id, prepare_body(self._validator, body))
        except InvalidRequest as exc:
            param = exc.param if exc.param in ("custom_id", None) else f"body.{exc.param}"
            code = exc.code if exc.code != "invalid_request" else "invalid_parameter"
            raise _Refused(code, number, param, f"{where}: {exc.message}") from exc

    def _finish(self, chunk: list[_Prepared | LineError]) -> Iterator[LineSpec | LineError]:
        prepared = [item for item in chunk if isinstance(item, _Prepared)]
        token_ids = iter(self._validator.encode([p.request for p in prepared]))
        for item in chunk:
            if isinstance(item, LineError):
                yield item
                continue
            ids = next(token_ids)
            try:
                yield LineSpec(item.line, item.custom_id, self._validator.finish(item.request, ids))
            except InvalidRequest as exc:
                yield LineError(
                    code=exc.code,
                    line=item.line,
                    param=f"body.{exc.param}" if exc.param else None,
                    message=f"line {item.line} (custom_id {item.custom_id!r}): {exc.message}",
                )


class _Refused(Exception):
    """A line refused while it was checked; carries the `LineError` to report."""

    def __init__(self, code: str, line: int, param: str | None, message: str) -> None:
        super().__init__(message)
        self.error = LineError(code=code, line=line, param=param, message=message)

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
