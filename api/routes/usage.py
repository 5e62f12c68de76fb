"""`/v1/usage`: a tenant's tokens and requests by day or hour, model and API key, in the
shape of OpenAI's usage API (pages of time buckets, each with a result per group)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, Field

from api.deps import PrincipalDep, UsageOpsDep
from api.errors import error_responses
from inferq.domain.usage import GROUPS, BucketWidth, GroupBy, UsageBucket, UsageResult
from inferq.exceptions import InvalidRequest

router = APIRouter(tags=["usage"], responses=error_responses(401, 403, 422, 429, 503))
# The last second a time may name (the end of year 9999).
LATEST_S = 253_402_300_799


class UsageResultPublic(BaseModel):
    object: Literal["usage.result"] = "usage.result"
    input_tokens: int = Field(description="Prompt tokens of generation (chats, completions).")
    output_tokens: int = Field(description="Tokens generated.")
    embedding_tokens: int = Field(description="Tokens embedded (`/v1/embeddings`).")
    num_model_requests: int = Field(description="Single jobs and batch lines that ended.")
    jobs: int = Field(description="Single jobs (online requests too) that ended.")
    batch_lines: int = Field(description="Batch lines that ended.")
    batches: int = Field(description="Batches created.")
    model: str | None = Field(description="The model, when grouped by `model`.")
    api_key_id: str | None = Field(description="The API key, when grouped by `api_key_id`.")
    tenant: str | None = Field(description="The tenant, when grouped by `tenant` (admins).")

    @classmethod
    def of(cls, result: UsageResult) -> UsageResultPublic:
        usage = result.usage
        return cls(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            embedding_tokens=usage.embedding_tokens,
            num_model_requests=usage.requests,
            jobs=usage.jobs,
            batch_lines=usage.batch_lines,
            batches=usage.batches,
            model=result.model,
            api_key_id=result.api_key_id,
            tenant=result.tenant,
        )


class UsageBucketPublic(BaseModel):
    object: Literal["bucket"] = "bucket"
    start_time: int = Field(description="Unix seconds; the bucket's first moment.")
    end_time: int = Field(description="Unix seconds; the moment after its last.")
    results: list[UsageResultPublic]

    @classmethod
    def of(cls, bucket: UsageBucket) -> UsageBucketPublic:
        return cls(
            start_time=int(bucket.start.timestamp()),
            end_time=int(bucket.end.timestamp()),
            results=[UsageResultPublic.of(r) for r in bucket.results],
        )


class UsagePagePublic(BaseModel):
    object: Literal["page"] = "page"
    data: list[UsageBucketPublic]
    has_more: bool
    next_page: str | None = Field(description="Pass as `page` for the buckets after these.")


@router.get("/v1/usage", response_model=UsagePagePublic)
def usage(
    operations: UsageOpsDep,
    principal: PrincipalDep,
    start_time: Annotated[
        int | None,
        Query(
            ge=0, le=LATEST_S, description="Unix seconds (default: the last 7 days, or 24 hours)."
        ),
    ] = None,
    end_time: Annotated[
        int | None, Query(ge=0, le=LATEST_S, description="Unix seconds (default: now).")
    ] = None,
    bucket_width: Annotated[BucketWidth, Query(description="`1d` (UTC days) or `1h`.")] = "1d",
    group_by: Annotated[
        list[str] | None,
        Query(description="`model`, `api_key_id`, `tenant` (admins); repeat, or join by commas."),
    ] = None,
    tenant: Annotated[
        str | None, Query(description="Admins: one tenant's usage (default: every tenant's).")
    ] = None,
    limit: Annotated[
        int | None,
        Query(ge=1, description="Buckets a page (1d: 7 by default, 31 at most; 1h: 24, 168)."),
    ] = None,
    page: Annotated[str | None, Query(description="The `next_page` of the last page.")] = None,
) -> UsagePagePublic:
    """Tokens and requests of the caller's tenant (an admin's: any tenant's, or all), in
    time buckets, each added up by the fields of `group_by`."""
    groups = _groups(group_by)
    if "tenant" in groups and not principal.admin:
        raise InvalidRequest(
            "only an admin groups by tenant: a key reads its own tenant's usage",
            param="group_by",
            code="invalid_value",
        )
    if page is not None:
        start_time = _page(page)
    found = operations.report(
        principal,
        start=_time(start_time),
        end=_time(end_time),
        width=bucket_width,
        group_by=groups,
        tenant=tenant,
        limit=limit,
    )
    return UsagePagePublic(
        data=[UsageBucketPublic.of(b) for b in found.buckets],
        has_more=found.next_page is not None,
        next_page=None if found.next_page is None else str(int(found.next_page.timestamp())),
    )


def _groups(values: list[str] | None) -> list[GroupBy]:
    names = [name.strip() for value in values or [] for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in GROUPS]
    if unknown:
        raise InvalidRequest(
            f"cannot group usage by {', '.join(unknown)}: group by {', '.join(GROUPS)}",
            param="group_by",
            code="invalid_value",
        )
    return [group for group in GROUPS if group in names]


def _time(unix_s: int | None) -> datetime | None:
    return None if unix_s is None else datetime.fromtimestamp(unix_s, UTC)


def _page(page: str) -> int:
    if not page.isdigit() or int(page) > LATEST_S:
        raise InvalidRequest(
            "page is the `next_page` of an earlier answer", param="page", code="invalid_value"
        )
    return int(page)
