"""`/v1/status` for people, `/metrics` for Prometheus."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, Field

from api.deps import CatalogDep, QueuesDep, WorkersDep, current_principal
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


class ModelStatus(BaseModel):
    name: str
    base: str = Field(description="The served model whose workers run it.")
    runner: str
    workers: list[str] = Field(description="Workers online that serve it (none: its jobs wait).")


class Status(BaseModel):
    """The deployment at a glance."""

    queues: dict[str, int] = Field(description="Messages waiting in each queue.")
    models: list[ModelStatus] = Field(description="Every registered model name.")
    workers: list[WorkerPublic]
    jobs_per_s: float
    tokens_per_s: float
    prompt_tokens_per_s: float


@router.get(
    "/v1/status",
    response_model=Status,
    responses=error_responses(401, 429, 503),
    dependencies=[Depends(current_principal)],
)
def status(catalog: CatalogDep, queues: QueuesDep, registry: WorkersDep) -> Status:
    """Queue depths, the GPU workers online, and throughput over the last minute."""
    workers = registry.online()
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
            )
            for w in workers
        ],
        jobs_per_s=sum(w.jobs_last_minute for w in workers) / 60,
        tokens_per_s=sum(w.generated_tokens_last_minute for w in workers) / 60,
        prompt_tokens_per_s=sum(w.prompt_tokens_last_minute for w in workers) / 60,
    )


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    """Prometheus metrics of this API process."""
    registry = request.app.state.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
