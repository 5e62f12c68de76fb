"""The authenticator on a fake key store with the real interface."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api.auth import Authenticator
from inferq.domain.api_keys import ApiKey, hash_key
from inferq.exceptions import Unauthorized


class FakeKeys:
    def __init__(self) -> None:
        self.keys: dict[str, ApiKey] = {}
        self.lookups = 0

    def add(self, secret: str, *, tenant: str, admin: bool = False) -> None:
        self.keys[hash_key(secret)] = ApiKey(
            id=f"key_{tenant}",
            name=tenant,
            tenant=tenant,
            admin=admin,
            prefix=secret[:10],
            created_at=datetime.now(UTC),
        )

    def find(self, secret: str) -> ApiKey | None:
        self.lookups += 1
        return self.keys.get(hash_key(secret))

    def revoke(self, secret: str) -> None:
        key = self.keys[hash_key(secret)]
        self.keys[hash_key(secret)] = ApiKey(**{**key.__dict__, "revoked_at": datetime.now(UTC)})


def test_a_known_key_maps_to_its_tenant_and_is_cached() -> None:
    keys = FakeKeys()
    keys.add("iq_alice", tenant="research")
    auth = Authenticator(keys, enabled=True, cache_s=60)  # type: ignore[arg-type]
    first = auth.principal("iq_alice")
    again = auth.principal("iq_alice")
    assert first == again
    assert first.tenant == "research"
    assert first.scope == "research"
    assert keys.lookups == 1


def test_without_a_cache_a_revoked_key_fails_at_once() -> None:
    keys = FakeKeys()
    keys.add("iq_bob", tenant="ops", admin=True)
    auth = Authenticator(keys, enabled=True, cache_s=0)  # type: ignore[arg-type]
    assert auth.principal("iq_bob").scope is None
    keys.revoke("iq_bob")
    with pytest.raises(Unauthorized, match="revoked"):
        auth.principal("iq_bob")


@pytest.mark.parametrize("secret", [None, "", "   ", "iq_unknown"])
def test_missing_or_unknown_keys_are_refused(secret: str | None) -> None:
    auth = Authenticator(FakeKeys(), enabled=True, cache_s=0)  # type: ignore[arg-type]
    with pytest.raises(Unauthorized):
        auth.principal(secret)


def test_with_auth_off_everyone_is_the_development_admin() -> None:
    auth = Authenticator(FakeKeys(), enabled=False, cache_s=0)  # type: ignore[arg-type]
    assert auth.principal(None).admin
