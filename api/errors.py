"""Error mapping: the only place HTTP status codes meet inferq's exceptions.

Every error body has OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`,
so the `openai` client raises a helpful exception with our message in it.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException
from starlette.routing import Match

from inferq.domain.jobs import JobError, JobStatus
from inferq.exceptions import (
    BrokerUnavailable,
    Forbidden,
    InferqError,
    InvalidRequest,
    InvalidState,
    JobFailed,
    ModelUnavailable,
    NotFound,
    QuotaExceeded,
    RetryLater,
    StoreUnavailable,
    TooLarge,
    Unauthorized,
)

log = logging.getLogger(__name__)

RETRY_AFTER_S = "5"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    """Every error response: OpenAI's shape."""

    error: ErrorDetail


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the error statuses a route can answer with."""
    described = {
        401: "No valid API key.",
        403: "The key may not do this.",
        404: "No such object (or it belongs to another tenant).",
        409: "The object's state does not allow this.",
        413: "The request body is too large.",
        422: "The request is invalid; the message names the field and the limit.",
        429: "Rate limit, quota or queue full; retry after `Retry-After` seconds.",
        503: "Postgres or Redis is unavailable; retry after `Retry-After` seconds.",
    }
    return {code: {"model": ErrorBody, "description": described[code]} for code in codes}


def error_body(
    message: str, *, type_: str, param: str | None = None, code: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code, **extra}}


# Each inferq error's status and OpenAI error type; the first match wins.
_STATUSES: tuple[tuple[type[InferqError], int, str], ...] = (
    (Unauthorized, 401, "authentication_error"),
    (Forbidden, 403, "permission_error"),
    (NotFound, 404, "not_found_error"),
    (InvalidState, 409, "conflict_error"),
    (TooLarge, 413, "invalid_request_error"),
    (InvalidRequest, 422, "invalid_request_error"),
    (QuotaExceeded, 429, "insufficient_quota"),
    (RetryLater, 429, "rate_limit_error"),
    (StoreUnavailable, 503, "service_unavailable"),
    (BrokerUnavailable, 503, "service_unavailable"),
    (ModelUnavailable, 503, "service_unavailable"),
    (JobFailed, 500, "server_error"),
)


def ended_error(
    job_id: str, status: JobStatus, error: JobError | None
) -> InvalidState | JobFailed | None:
    """What a request answers with when its job ended without a result (cancelled, or
    failed with the job's error); None when it succeeded."""
    if status is JobStatus.SUCCEEDED:
        return None
    if status is JobStatus.CANCELLED:
        return InvalidState(f"the request was cancelled (job {job_id})")
    return JobFailed(
        error.message if error else f"job {job_id} failed",
        code=error.code if error else "failed",
    )


def mapped_status(exc_type: type[InferqError]) -> tuple[int, str] | None:
    """The status and OpenAI error type of an inferq error of this class (None: unmapped)."""
    return next(
        ((status, type_) for cls, status, type_ in _STATUSES if issubclass(exc_type, cls)), None
    )


def _status_of(exc: InferqError) -> tuple[int, str]:
    return mapped_status(type(exc)) or (500, "server_error")


def error_json(exc: InferqError) -> dict[str, Any]:
    """The body an error is answered with (also the `error` event of a stream)."""
    status, type_ = _status_of(exc)
    code = getattr(exc, "code", None) or {401: "invalid_api_key", 413: "request_too_large"}.get(
        status
    )
    return error_body(exc.message, type_=type_, param=getattr(exc, "param", None), code=code)


def _inferq_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InferqError)
    status, _ = _status_of(exc)
    headers: dict[str, str] = {}
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    elif isinstance(exc, RetryLater):
        headers["Retry-After"] = str(exc.retry_after_s)
    elif status == 503:
        headers["Retry-After"] = RETRY_AFTER_S
        log.warning("service unavailable: %s", exc.message)
    elif status == 500 and not isinstance(exc, JobFailed):
        log.error("unmapped inferq error: %s", exc.message)
    return JSONResponse(error_json(exc), status_code=status, headers=headers)


_BRANCH_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _location(loc: tuple[int | str, ...]) -> str:
    """`messages.0.role` from pydantic's location, without the request part or the names
    pydantic gives union branches (`list[ChatMessage]`, `str`)."""
    parts = [
        str(p)
        for p in loc
        if p not in ("body", "query", "path", "header")
        and not (isinstance(p, str) and ("[" in p or p in _BRANCH_TAGS))
    ]
    return ".".join(parts) or "body"


def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    details = []
    for error in exc.errors():
        param = _location(tuple(error.get("loc", ())))
        message = error.get("msg", "invalid value")
        if error.get("type") == "extra_forbidden":
            message = "unknown field; remove it (see /docs for the accepted fields)"
        details.append({"param": param, "message": message})
    summary = "; ".join(f"{d['param']}: {d['message']}" for d in details)
    body = error_body(
        summary or "invalid request",
        type_="invalid_request_error",
        param=details[0]["param"] if details else None,
        code="invalid_request",
        details=details,
    )
    return JSONResponse(body, status_code=422)


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    status, message, headers = exc.status_code, str(exc.detail), dict(exc.headers or {})
    if status == 400:
        # FastAPI's answer to a body it cannot decode (not UTF-8, say): the same 422 as
        # malformed JSON, so clients meet one status for one kind of mistake.
        status, message = 422, "the request body is not valid UTF-8 JSON, or is nested too deeply"
    elif status == 405:
        headers["Allow"] = ", ".join(_allowed_methods(request))
    code = {413: "request_too_large", 422: "invalid_json"}.get(status)
    return JSONResponse(
        error_body(message, type_="invalid_request_error", code=code),
        status_code=status,
        headers=headers,
    )


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route serves at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match is not Match.NONE:
            methods.update(getattr(route, "methods", None) or ())
    return sorted(methods)


def register_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(InferqError, _inferq_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(HTTPException, _http_error)
