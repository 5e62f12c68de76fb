"""`/v1/admin/keys`: an admin lists API keys and sets their limits (rate limits and
quotas); `inferq keys` does the same from the command line."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from api.deps import PrincipalDep, UsageOpsDep
from api.errors import error_responses
from inferq.domain.api_keys import ApiKey

# What the columns hold.
INT32, INT64 = 2**31 - 1, 2**63 - 1

router = APIRouter(
    prefix="/v1/admin/keys", tags=["admin"], responses=error_responses(401, 403, 429, 503)
)


# Weights past this would starve a tenant of weight 1 for hours behind a heavy one.
WEIGHT_MAX = 1000


class KeyPublic(BaseModel):
    object: str = "api_key"
    id: str
    name: str
    tenant: str
    admin: bool
    prefix: str = Field(description="The key's first characters (the secret is never kept).")
    created_at: datetime
    revoked_at: datetime | None
    rpm: int | None = Field(description="Requests a minute (0: unlimited; null: the default).")
    tpm: int | None = Field(description="Job tokens a minute (0: unlimited; null: the default).")
    max_queued_tokens: int | None = Field(
        description="Quota: prompt plus max_tokens (times n) of its jobs queued or running "
        "at once (null: none)."
    )
    daily_tokens: int | None = Field(
        description="Quota: tokens a UTC day, used plus queued (null: none)."
    )
    weight: int = Field(
        description="Its tenant's share of batch work against other tenants' (the largest "
        "weight of a tenant's live keys counts)."
    )

    @classmethod
    def of(cls, key: ApiKey) -> KeyPublic:
        return cls(
            id=key.id,
            name=key.name,
            tenant=key.tenant,
            admin=key.admin,
            prefix=key.prefix,
            created_at=key.created_at,
            revoked_at=key.revoked_at,
            rpm=key.rpm,
            tpm=key.tpm,
            max_queued_tokens=key.quota.max_queued_tokens,
            daily_tokens=key.quota.daily_tokens,
            weight=key.weight,
        )


class KeysPublic(BaseModel):
    object: str = "list"
    data: list[KeyPublic]


class KeyUpdate(BaseModel):
    """The limits to change; those left out stay as they are."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rpm: int | None = Field(None, ge=0, le=INT32, description="0: unlimited; null: the default.")
    tpm: int | None = Field(None, ge=0, le=INT32, description="0: unlimited; null: the default.")
    max_queued_tokens: int | None = Field(None, ge=0, le=INT64, description="0 or null: no quota.")
    daily_tokens: int | None = Field(None, ge=0, le=INT64, description="0 or null: no quota.")
    weight: int = Field(
        1,
        ge=1,
        le=WEIGHT_MAX,
        description="Its tenant's share of batch work against other tenants' (default 1).",
    )


@router.get("", response_model=KeysPublic)
def list_keys(operations: UsageOpsDep, principal: PrincipalDep) -> KeysPublic:
    """Every API key (never its secret). Admins only."""
    return KeysPublic(data=[KeyPublic.of(key) for key in operations.keys(principal)])


@router.patch("/{key_id}", response_model=KeyPublic, responses=error_responses(404, 422))
def update_key(
    key_id: str, body: KeyUpdate, operations: UsageOpsDep, principal: PrincipalDep
) -> KeyPublic:
    """Set a key's rate limits and quotas. Admins only; applies to its requests within the
    API's key cache time (`INFERQ_AUTH_CACHE_S`)."""
    changes = body.model_dump(exclude_unset=True)
    return KeyPublic.of(operations.update_key(principal, key_id, **changes))
