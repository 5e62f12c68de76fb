"""The Idempotency-Key header: a request claims its key, and a retry gets the first
response again instead of doing the work twice."""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, TypeVar

from fastapi import Header
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool

from inferq.constants import IDEMPOTENT_REPLAY_HEADER
from inferq.domain.api_keys import Principal
from inferq.store.idempotency import IdempotencyStore, IdempotentRequest, StoredResponse

T = TypeVar("T")

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        description="Retry-safe submission: the same key with the same body returns the "
        "first response (kept 24 h, per API key); with another body, 422.",
    ),
]


class Idempotency:
    """Runs a submission at most once per key: `store` remembers each key's response for
    `ttl_s` seconds."""

    def __init__(self, store: IdempotencyStore, *, ttl_s: int) -> None:
        self._store = store
        self._ttl_s = ttl_s

    async def run(
        self,
        key: str | None,
        *,
        body: BaseModel,
        principal: Principal,
        run: Callable[[IdempotentRequest | None], Awaitable[T]],
    ) -> T | JSONResponse:
        """`run(request)`'s response, or under a key that was used before, that first
        response.

        `run` hands `request` (None without a key) to the store, which remembers the
        response in the transaction that does the work. If `run` fails, the key is let go,
        so a retry can go ahead.
        """
        if key is None:
            return await run(None)
        request = IdempotentRequest(key_id=principal.key_id, key=key)
        stored = await run_in_threadpool(
            functools.partial(
                self._store.begin, request, request_hash=_request_hash(body), ttl_s=self._ttl_s
            )
        )
        if stored is not None:
            return _replay(stored)
        try:
            return await run(request)
        except BaseException:
            await run_in_threadpool(self._store.abandon, request)
            raise


def _request_hash(body: BaseModel) -> str:
    canonical = json.dumps(
        body.model_dump(mode="json", exclude_unset=True), sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _replay(stored: StoredResponse) -> JSONResponse:
    headers = {IDEMPOTENT_REPLAY_HEADER: "true"}
    # A job's answer pointed at the job (its `url`), and so does its replay.
    location = stored.body.get("url")
    if location is not None:
        headers["Location"] = location
    return JSONResponse(stored.body, status_code=stored.status_code, headers=headers)
