"""Refuses URLs that carry a NUL character (`%00`) with 422, before any route runs:
no id, cursor or filter can contain one, and Postgres cannot even compare against it."""

from __future__ import annotations

import json
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

_BODY = json.dumps(
    {
        "error": {
            "message": "the URL contains a NUL character (%00): no id, cursor or filter has one",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_request",
        }
    }
).encode()


class RefuseNulInUrl:
    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            "\x00" in scope["path"] or b"\x00" in unquote_to_bytes(scope["query_string"])
        ):
            await send(
                {
                    "type": "http.response.start",
                    "status": 422,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": _BODY})
            return
        await self._app(scope, receive, send)
