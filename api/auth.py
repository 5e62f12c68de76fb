"""Who is calling: the bearer key, checked against the key store (briefly cached)."""

from __future__ import annotations

import threading
import time

from inferq.domain.api_keys import DEVELOPMENT_PRINCIPAL, Principal
from inferq.exceptions import Unauthorized
from inferq.store.api_keys import KeyStore

_HINT = (
    "send `Authorization: Bearer <key>` (or `x-api-key: <key>`); an operator creates keys with "
    "`inferq keys create --name NAME`"
)


class Authenticator:
    """Turns an `Authorization` header into a `Principal`, or raises `Unauthorized`."""

    def __init__(self, keys: KeyStore, *, enabled: bool, cache_s: float) -> None:
        self._keys = keys
        self._enabled = enabled
        self._cache_s = cache_s
        self._cache: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()

    def cached(self, secret: str | None) -> Principal | None:
        """The caller, if that needs no database read (None: call `principal`)."""
        if not self._enabled:
            return DEVELOPMENT_PRINCIPAL
        with self._lock:
            cached = self._cache.get((secret or "").strip())
        if cached is not None and time.monotonic() - cached[0] < self._cache_s:
            return cached[1]
        return None

    def principal(self, secret: str | None) -> Principal:
        """The caller holding this secret, from its bearer or `x-api-key` header (None
        when no credentials were sent)."""
        if not self._enabled:
            return DEVELOPMENT_PRINCIPAL
        secret = (secret or "").strip()
        if not secret:
            raise Unauthorized(f"an API key is required: {_HINT}")
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(secret)
        if cached is not None and now - cached[0] < self._cache_s:
            return cached[1]
        key = self._keys.find(secret)
        if key is None or not key.active:
            with self._lock:
                self._cache.pop(secret, None)
            raise Unauthorized(f"this API key is unknown or revoked: {_HINT}")
        principal = Principal(
            key_id=key.id,
            tenant=key.tenant,
            admin=key.admin,
            rpm=key.rpm,
            tpm=key.tpm,
            quota=key.quota,
        )
        with self._lock:
            self._cache[secret] = (now, principal)
        return principal
