"""The Idempotency-Key header: hashing a request, replaying a remembered response."""

from __future__ import annotations

import hashlib
import json
from typing import Annotated

from fastapi import Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from inferq.constants import IDEMPOTENT_REPLAY_HEADER
from inferq.db.idempotency import StoredResponse

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retry-safe submission: the same key with the same body returns the "
        "first response (kept 24 h, per API key); with another body, 422.",
    ),
]


def request_hash(body: BaseModel) -> str:
    canonical = json.dumps(
        body.model_dump(mode="json", exclude_unset=True), sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def replay(stored: StoredResponse, *, location: str | None = None) -> JSONResponse:
    headers = {IDEMPOTENT_REPLAY_HEADER: "true"}
    if location is not None:
        headers["Location"] = location
    return JSONResponse(stored.body, status_code=stored.status_code, headers=headers)
