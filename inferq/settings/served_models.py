"""The models a deployment serves, named once in its shared configuration so that they are
known (and their work queued) before any of their workers is up."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import NoDecode


class AnnouncedModel(BaseModel):
    """What one served model's workers set on top of the shared settings: the engine
    settings that decide the names it answers to and how the API checks its requests."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Each is `INFERQ_<NAME>` of the model's workers; one left out is the shared setting.
    model: str
    tokenizer: str | None = None
    runner: Literal["generate", "pooling"] | None = None
    max_model_len: int | None = None
    tool_call_parser: str | None = None
    lora_adapters: dict[str, str] | None = None


class ServedModelSettings(BaseModel):
    """The served models `inferq migrate` makes known, as their workers would announce them."""

    announce_models: Annotated[dict[str, AnnouncedModel], NoDecode] = Field(
        default_factory=dict,
        description="Served models `inferq migrate` makes known, so their work is accepted "
        "before any of their workers is up: `name=model` pairs, comma-separated, or a JSON "
        "object of name to what the model's workers set on top of the shared settings "
        '(`{"llama": {"model": "org/id", "max_model_len": 8192}}`; also `tokenizer`, '
        "`runner`, `tool_call_parser` and `lora_adapters`).",
    )

    @field_validator("announce_models", mode="before")
    @classmethod
    def _pairs_or_json(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if value.strip().startswith("{"):
            return json.loads(value)
        models = {}
        for part in (p.strip() for p in value.split(",")):
            name, sep, model = part.partition("=")
            if part and (not sep or not name.strip() or not model.strip()):
                raise ValueError(f"{part!r} is not name=model")
            if part:
                models[name.strip()] = {"model": model.strip()}
        return models
