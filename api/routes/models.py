"""`/v1/models`: the model this deployment serves (OpenAI's Models API)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel

from api.deps import ServicesDep, current_principal
from api.errors import error_responses
from inferq.exceptions import NotFound

router = APIRouter(
    prefix="/v1/models",
    tags=["models"],
    responses=error_responses(401, 429),
    dependencies=[Depends(current_principal)],
)


class ModelPublic(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "inferq"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelPublic]


@router.get("", response_model=ModelList)
def list_models(services: ServicesDep) -> ModelList:
    """The served model (use its id as `model`)."""
    return ModelList(data=[ModelPublic(id=services.settings.model_name)])


@router.get("/{model_id:path}", response_model=ModelPublic, responses=error_responses(404))
def get_model(model_id: str, services: ServicesDep) -> ModelPublic:
    """The served model, if that is its id."""
    if model_id != services.settings.model_name:
        raise NotFound(f"model {model_id!r} is not served here")
    return ModelPublic(id=model_id)
