"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from api.deps import ServicesDep
from api.schemas import Health
from inferq.exceptions import StoreUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """The process is up."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(services: ServicesDep) -> JSONResponse:
    """Postgres and Redis are reachable."""
    checks: dict[str, str] = {}
    try:
        services.store.ping()
        checks["postgres"] = "ok"
    except StoreUnavailable as exc:
        checks["postgres"] = exc.message
    try:
        services.redis.ping()
        checks["redis"] = "ok"
    except RedisError as exc:
        checks["redis"] = f"unreachable: {exc}"
    ready = all(v == "ok" for v in checks.values())
    body = Health(status="ready" if ready else "unavailable", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
