"""The API-key store."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError

from inferq.domain.api_keys import ApiKey, generate_key, hash_key
from inferq.domain.usage import Quota
from inferq.exceptions import NotFound
from inferq.ids import new_id
from inferq.store.base import Store
from inferq.store.models import ApiKeyRow

KEY_ID_PREFIX = "key_"
_QUOTAS = ("max_queued_tokens", "daily_tokens")
_LIMITS = ("rpm", "tpm", *_QUOTAS)
_SETTINGS = (*_LIMITS, "weight")
SHOWN_PREFIX_CHARS = 10


class KeyStore(Store):
    """Creates, finds and revokes API keys. Secrets are never stored, only their hashes."""

    def create(
        self,
        *,
        name: str,
        tenant: str | None = None,
        admin: bool = False,
        rpm: int | None = None,
        tpm: int | None = None,
        secret: str | None = None,
    ) -> tuple[ApiKey, str]:
        """A new key and its secret; the secret is shown now and never again."""
        secret = secret or generate_key()
        row = ApiKeyRow(
            id=new_id(KEY_ID_PREFIX),
            name=name,
            tenant=tenant or name,
            key_hash=hash_key(secret),
            prefix=secret[:SHOWN_PREFIX_CHARS],
            admin=admin,
            rpm=rpm,
            tpm=tpm,
            weight=1,
            created_at=self._clock(),
            revoked_at=None,
        )
        with self._transaction() as session:
            session.add(row)
        return _key_from_row(row), secret

    def ensure(self, secret: str, *, name: str, admin: bool) -> ApiKey:
        """The key with this secret, created if missing (safe to race: hashes are unique)."""
        found = self.find(secret)
        if found is not None:
            return found
        try:
            return self.create(name=name, admin=admin, secret=secret)[0]
        except IntegrityError:
            found = self.find(secret)
            assert found is not None
            return found

    def find(self, secret: str) -> ApiKey | None:
        with self._transaction() as session:
            row = session.scalars(
                select(ApiKeyRow).where(ApiKeyRow.key_hash == hash_key(secret))
            ).first()
            return None if row is None else _key_from_row(row)

    def list(self) -> list[ApiKey]:
        with self._transaction() as session:
            rows = session.scalars(select(ApiKeyRow).order_by(ApiKeyRow.id)).all()
            return [_key_from_row(row) for row in rows]

    def count_active(self) -> int:
        with self._transaction() as session:
            count = session.scalar(
                select(func.count()).select_from(ApiKeyRow).where(ApiKeyRow.revoked_at.is_(None))
            )
            return int(count or 0)

    def get(self, key_id: str) -> ApiKey:
        with self._transaction() as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                raise NotFound(f"no API key with id {key_id!r}")
            return _key_from_row(row)

    def update(self, key_id: str, **changes: int | None) -> ApiKey:
        """Change a key's limits: `rpm`, `tpm`, `max_queued_tokens`, `daily_tokens`, and
        its tenant's `weight` in the share of batch work (1 or more). For a quota, 0
        removes it; for a rate limit, 0 is unlimited and None the deployment's default."""
        unknown = set(changes) - set(_SETTINGS)
        if unknown:
            raise ValueError(f"not a key setting: {', '.join(sorted(unknown))}")
        if "weight" in changes and (changes["weight"] is None or changes["weight"] < 1):
            raise ValueError("a key's weight is 1 or more")
        with self._transaction() as session:
            row = session.get(ApiKeyRow, key_id, with_for_update=True)
            if row is None:
                raise NotFound(f"no API key with id {key_id!r}")
            for name, value in changes.items():
                setattr(row, name, None if name in _QUOTAS and not value else value)
            return _key_from_row(row)

    def revoke(self, key_id: str) -> ApiKey:
        with self._transaction() as session:
            row = session.get(ApiKeyRow, key_id)
            if row is None:
                raise NotFound(f"no API key with id {key_id!r}")
            if row.revoked_at is None:
                row.revoked_at = self._clock()
            return _key_from_row(row)


def _key_from_row(row: ApiKeyRow) -> ApiKey:
    quota = Quota(max_queued_tokens=row.max_queued_tokens, daily_tokens=row.daily_tokens)
    return ApiKey(
        id=row.id,
        name=row.name,
        tenant=row.tenant,
        admin=row.admin,
        prefix=row.prefix,
        created_at=row.created_at,
        revoked_at=row.revoked_at,
        rpm=row.rpm,
        tpm=row.tpm,
        quota=quota,
        weight=row.weight if row.weight is not None else 1,
    )
