"""Idempotency keys: the first response to a request, remembered per API key.

A request with a key first claims it (a committed "in progress" row). The work it does
and the response it sends are then written in one transaction, so a crash can never leave
work done without its response remembered, nor a response remembered without the work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from inferq.exceptions import InvalidRequest, InvalidState
from inferq.store.base import Store, as_utc
from inferq.store.dialects import conflict_insert, on_postgres
from inferq.store.models import IdempotencyKeyRow

# A claim older than this whose response never came belonged to a request that died.
STALE_CLAIM_S = 60
MAX_KEY_CHARS = 255


@dataclass(frozen=True)
class StoredResponse:
    status_code: int
    body: dict[str, Any]


@dataclass(frozen=True)
class IdempotentRequest:
    """What to remember a response under."""

    key_id: str
    key: str


def record_response(
    session: Session, request: IdempotentRequest, *, status_code: int, body: dict[str, Any]
) -> None:
    """Remember the response, inside the transaction that did the work."""
    session.execute(
        update(IdempotencyKeyRow)
        .where(IdempotencyKeyRow.key_id == request.key_id, IdempotencyKeyRow.key == request.key)
        .values(status_code=status_code, response=body)
    )


class IdempotencyStore(Store):
    def begin(
        self, request: IdempotentRequest, *, request_hash: str, ttl_s: int
    ) -> StoredResponse | None:
        """Claim the key for this request, or return the response it got before.

        Raises `InvalidRequest` if the key came with a different request, and
        `InvalidState` while another request with the key is still being answered.
        """
        if not request.key or len(request.key) > MAX_KEY_CHARS or not request.key.isprintable():
            raise InvalidRequest(
                f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} printable characters",
                param="Idempotency-Key",
            )
        now = self._clock()
        with self._transaction() as session:
            if self._insert(session, request, request_hash, now, ttl_s):
                return None
            row = session.get(
                IdempotencyKeyRow, (request.key_id, request.key), with_for_update=True
            )
            assert row is not None
            if as_utc(row.expires_at) <= now or (
                row.status_code is None
                and as_utc(row.created_at) < now - timedelta(seconds=STALE_CLAIM_S)
            ):
                row.request_hash, row.status_code, row.response = request_hash, None, None
                row.created_at, row.expires_at = now, now + timedelta(seconds=ttl_s)
                return None
            if row.request_hash != request_hash:
                raise InvalidRequest(
                    "this Idempotency-Key was already used with a different request: "
                    "use a new key for a new request",
                    param="Idempotency-Key",
                    code="idempotency_key_reused",
                )
            if row.status_code is None or row.response is None:
                raise InvalidState(
                    "a request with this Idempotency-Key is still being processed: "
                    "retry in a moment"
                )
            return StoredResponse(row.status_code, row.response)

    def abandon(self, request: IdempotentRequest) -> None:
        """Forget an unanswered claim (its request failed), so a retry can go ahead."""
        with self._transaction() as session:
            session.execute(
                delete(IdempotencyKeyRow).where(
                    IdempotencyKeyRow.key_id == request.key_id,
                    IdempotencyKeyRow.key == request.key,
                    IdempotencyKeyRow.status_code.is_(None),
                )
            )

    @staticmethod
    def _insert(
        session: Session,
        request: IdempotentRequest,
        request_hash: str,
        now: datetime,
        ttl_s: int,
    ) -> bool:
        statement = (
            conflict_insert(IdempotencyKeyRow, postgres=on_postgres(session))
            .values(
                key_id=request.key_id,
                key=request.key,
                request_hash=request_hash,
                created_at=now,
                expires_at=now + timedelta(seconds=ttl_s),
            )
            .on_conflict_do_nothing()
            .returning(IdempotencyKeyRow.key)
        )
        return session.execute(statement).first() is not None
