"""A small client for inferq's HTTP API, used by the command line."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from httpx_sse import ServerSentEvent, SSEError, connect_sse

from inferq.exceptions import InferqError

RETRIES = 5


class ApiError(InferqError):
    """The API refused a request, or could not be reached."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class Client:
    def __init__(self, base_url: str, *, api_key: str | None, timeout_s: float = 60) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s)
        self.base_url = base_url

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        return self._send("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """POST with an Idempotency-Key, retried on dropped connections and 5xx/429."""
        key = uuid.uuid4().hex
        return self._send("POST", path, json=body or {}, headers={"Idempotency-Key": key})

    def delete(self, path: str) -> dict[str, Any]:
        return self._send("DELETE", path)

    def upload(self, path: Path, *, purpose: str = "batch") -> dict[str, Any]:
        with path.open("rb") as handle:
            return self._send(
                "POST",
                "/v1/files",
                files={"file": (path.name, handle, "application/jsonl")},
                data={"purpose": purpose},
                retry=False,
            )

    def download(self, file_id: str) -> Iterator[bytes]:
        with self.stream(f"/v1/files/{file_id}/content") as response:
            yield from response.iter_bytes()

    @contextmanager
    def stream(self, path: str, **params: Any) -> Iterator[httpx.Response]:
        """A GET whose body is read as it comes (headers first); refusals and lost
        connections raise `ApiError`."""
        try:
            with self._http.stream("GET", path, params=params) as response:
                if response.is_error:
                    response.read()
                    raise _error(response)
                yield response
        except httpx.HTTPError as exc:
            raise ApiError(f"cannot reach the inferq API at {self.base_url}: {exc}") from exc

    @contextmanager
    def events(
        self, path: str, *, last_event_id: str | None = None, **params: Any
    ) -> Iterator[Iterator[ServerSentEvent]]:
        """The Server-Sent Events of a GET, as they come; refusals and lost connections
        raise `ApiError`."""
        headers = {} if last_event_id is None else {"Last-Event-ID": last_event_id}
        try:
            with connect_sse(self._http, "GET", path, params=params, headers=headers) as source:
                if source.response.is_error:
                    source.response.read()
                    raise _error(source.response)
                yield source.iter_sse()
        except (httpx.HTTPError, SSEError) as exc:
            raise ApiError(f"lost the inferq API at {self.base_url}: {exc}") from exc

    def _send(self, method: str, path: str, *, retry: bool = True, **kwargs: Any) -> dict[str, Any]:
        for attempt in range(RETRIES if retry else 1):
            try:
                response = self._http.request(method, path, **kwargs)
            except httpx.TransportError as exc:
                if not retry or attempt == RETRIES - 1:
                    raise ApiError(
                        f"cannot reach the inferq API at {self.base_url}: {exc}"
                    ) from exc
                time.sleep(0.5 * (attempt + 1))
                continue
            if retry and response.status_code in (409, 429, 502, 503) and attempt < RETRIES - 1:
                time.sleep(float(response.headers.get("retry-after", 0.5 * (attempt + 1))))
                continue
            if response.is_error:
                raise _error(response)
            data: dict[str, Any] = response.json()
            return data
        raise AssertionError("unreachable")


def _error(response: httpx.Response) -> ApiError:
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text
    return ApiError(f"error {response.status_code}: {message}", status=response.status_code)
