"""`/v1/models`: every model the GPU workers registered (OpenAI's Models API), adapters
included."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends
from pydantic import BaseModel, Field

from api.deps import CatalogDep, current_principal
from api.errors import error_responses
from inferq.domain.served_models import ServedModel
from inferq.exceptions import ModelNotFound

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
    root: str = Field(description="The served model whose workers run it.")
    parent: str | None = Field(None, description="An adapter's base model.")
    runner: str = Field(description="`generate` (completions, chats) or `pooling` (embeddings).")
    max_model_len: int | None = Field(None, description="Context length in tokens.")

    @classmethod
    def from_model(cls, model: ServedModel) -> ModelPublic:
        return cls(
            id=model.name,
            root=model.base,
            parent=model.base if model.is_adapter else None,
            runner=model.runner,
            max_model_len=model.max_model_len,
        )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelPublic]


@router.get("", response_model=ModelList)
def list_models(catalog: CatalogDep) -> ModelList:
    """Every model workers registered (use an id as `model`)."""
    return ModelList(data=[ModelPublic.from_model(m) for m in catalog.models()])


@router.get("/{model_id:path}", response_model=ModelPublic, responses=error_responses(404))
def get_model(model_id: str, catalog: CatalogDep) -> ModelPublic:
    """One registered model."""
    for model in catalog.models():
        if model.name == model_id:
            return ModelPublic.from_model(model)
    raise ModelNotFound(f"model {model_id!r} is not served here")
