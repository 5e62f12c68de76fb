"""Refuses request bodies over a size limit with 413, before they are read into memory."""

from __future__ import annotations

import json

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class _TooLarge(HTTPException):
    """Raised while a body without a declared length is read; an HTTPException so that
    FastAPI's body parsing passes it on instead of calling it a parse error."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"the request body is over the limit of {limit} bytes")


class BodySizeLimit:
    """ASGI middleware: `limit_bytes` for most routes, `upload_limit_bytes` for uploads."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        limit_bytes: int,
        upload_limit_bytes: int | None = None,
        upload_paths: tuple[str, ...] = (),
    ) -> None:
        self._app = app
        self._limit = limit_bytes
        self._upload_limit = upload_limit_bytes or limit_bytes
        self._upload_paths = upload_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        limit = self._upload_limit if scope["path"] in self._upload_paths else self._limit
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _refuse(send, limit)
            return
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _TooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _refuse(send, limit)


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps(
        {
            "error": {
                "message": f"the request body is over the limit of {limit} bytes",
                "type": "invalid_request_error",
                "param": None,
                "code": "request_too_large",
            }
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": body})
