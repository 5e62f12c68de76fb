"""API keys and tenants: who is asking, and whose data they may see."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, field
from datetime import datetime

from inferq.domain.usage import Quota

KEY_PREFIX = "iq_"
# Keys are 256 random bits, so a plain SHA-256 is a safe way to store them (slow hashes
# protect guessable passwords, not random keys) and lets a request find its key by index.
_KEY_BYTES = 32


def generate_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(_KEY_BYTES)


def hash_key(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class ApiKey:
    """An API key as stored: never the secret itself, only its hash and first characters."""

    id: str
    name: str
    tenant: str
    admin: bool
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None
    rpm: int | None = None
    tpm: int | None = None
    quota: Quota = field(default_factory=Quota)
    # Its tenant's share of batch work against other tenants' (inferq/domain/fair_share.py).
    weight: int = 1

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True, kw_only=True)
class Principal:
    """The caller of a request: a key, its tenant, and whether it sees every tenant."""

    key_id: str
    tenant: str
    admin: bool
    rpm: int | None = None
    tpm: int | None = None
    # Its quota as last read (the submission checks the key's row itself, but only for a
    # key this says has one: a quota set on a key applies once the API reads it again).
    quota: Quota = field(default_factory=Quota)

    @property
    def scope(self) -> str | None:
        """The tenant whose data this caller may see; None for an admin (all of them)."""
        return None if self.admin else self.tenant


# When auth is off (development only) every request acts as this admin.
DEVELOPMENT_PRINCIPAL = Principal(key_id="development", tenant="default", admin=True)
