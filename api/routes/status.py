"""`/v1/status` for people, `/metrics` for Prometheus."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from api.deps import CatalogDep, PrincipalDep, QueuesDep, UsageOpsDep, WorkersDep
from api.errors import error_responses

router = APIRouter(tags=["status"])


class WorkerPublic(BaseModel):
    name: str
    model: str = Field(description="The served model whose queues it consumes.")
    runner: str = Field(description="`generate`, or `pooling` (embeddings).")
    adapters: list[str] = Field(description="LoRA adapters it serves on `model`.")
    gpus: list[str]
    started_at: str
    jobs_held: int
    sequences_in_flight: int
    engine_restarts: int
    jobs_per_s: float = Field(description="Jobs finished per second over the last minute.")
    tokens_per_s: float = Field(description="Tokens generated per second over the last minute.")
    room: bool = Field(
        description="It could take another message now (a free thread and room in its engine)."
    )
    stuck: str | None = Field(
        description="Why it is stuck (room, work waiting in its queues, and none taken for "
        "`INFERQ_STALL_S`), while it is: it consumes again, then exits to be restarted; "
        "null while it is not."
    )


class ModelStatus(BaseModel):
    name: str
    base: str = Field(description="The served model whose workers run it.")
    runner: str
    workers: list[str] = Field(description="Workers online that serve it (none: its jobs wait).")


class QuotaPublic(BaseModel):
    """The caller's key against its quota."""

    max_queued_tokens: int | None = Field(description="Its limit on queued tokens (null: none).")
    queued_tokens: int = Field(
        description="Prompt plus max_tokens (times n) of its jobs queued or running."
    )
    daily_tokens: int | None = Field(description="Its limit of tokens a UTC day (null: none).")
    used_today: int = Field(description="Tokens its work that ended today (UTC) used.")
    tokens_today: int = Field(description="What the daily quota counts: used plus queued.")


class Status(BaseModel):
    """The deployment at a glance."""

    queues: dict[str, int] = Field(description="Messages waiting in each queue.")
    models: list[ModelStatus] = Field(description="Every registered model name.")
    workers: list[WorkerPublic]
    jobs_per_s: float
    tokens_per_s: float
    prompt_tokens_per_s: float
    quota: QuotaPublic | None = Field(
        None, description="The caller's API key against its quota (null: it has none)."
    )


@router.get(
    "/v1/status",
    response_model=Status,
    responses=error_responses(401, 429, 503),
)
def status(
    catalog: CatalogDep,
    queues: QueuesDep,
    registry: WorkersDep,
    usage: UsageOpsDep,
    principal: PrincipalDep,
) -> Status:
    """Queue depths, the GPU workers online (and which are stuck, and why), throughput over
    the last minute, and the caller's key against its quota."""
    workers = registry.online()
    standing = usage.standing(principal)
    models = catalog.models()
    return Status(
        queues=queues.depths(sorted({m.base for m in models})),
        models=[
            ModelStatus(
                name=m.name,
                base=m.base,
                runner=m.runner,
                workers=[w.name for w in workers if w.model == m.base],
            )
            for m in models
        ],
        workers=[
            WorkerPublic(
                name=w.name,
                model=w.model,
                runner=w.runner,
                adapters=w.adapters,
                gpus=w.gpus,
                started_at=w.started_at,
                jobs_held=w.jobs_held,
                sequences_in_flight=w.sequences_in_flight,
                engine_restarts=w.engine_restarts,
                jobs_per_s=w.jobs_last_minute / 60,
                tokens_per_s=w.generated_tokens_last_minute / 60,
                room=w.room,
                stuck=w.stuck,
            )
            for w in workers
        ],
        jobs_per_s=sum(w.jobs_last_minute for w in workers) / 60,
        tokens_per_s=sum(w.generated_tokens_last_minute for w in workers) / 60,
        prompt_tokens_per_s=sum(w.prompt_tokens_last_minute for w in workers) / 60,
        quota=None
        if standing is None
        else QuotaPublic(
            max_queued_tokens=standing.quota.max_queued_tokens,
            queued_tokens=standing.queued_tokens,
            daily_tokens=standing.quota.daily_tokens,
            used_today=standing.used_today,
            tokens_today=standing.tokens_today,
        ),
    )


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus metrics of this API process."""
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
