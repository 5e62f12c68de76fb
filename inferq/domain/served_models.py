"""What the GPU workers serve: each registers its model (and the model's LoRA adapters) in
Postgres, and the API learns from there which names it accepts and how to check them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from inferq.settings import EngineSettings, Settings

Runner = Literal["generate", "pooling"]


@dataclass(frozen=True, kw_only=True)
class ServedModel:
    """A name clients may put in `model`."""

    name: str
    # The served model whose workers run it: its own name, or an adapter's base.
    base: str
    runner: Runner
    # What the API loads to count and check prompts as the engine will.
    tokenizer: str
    # None: the model's own, from its config.
    max_model_len: int | None
    chat_template: str | None = None
    tool_call_parser: str | None = None
    # A LoRA adapter's path or Hugging Face id (None: not an adapter).
    adapter: str | None = None
    # An embedding model's vector length, and whether it can shorten them (`dimensions`).
    embedding_size: int | None = None
    supports_dimensions: bool = False

    @property
    def is_adapter(self) -> bool:
        return self.adapter is not None


def served_by(
    settings: EngineSettings,
    *,
    max_model_len: int | None = None,
    chat_template: str | None = None,
    embedding_size: int | None = None,
    supports_dimensions: bool = False,
) -> list[ServedModel]:
    """The names a worker with these settings answers to: its model, then its adapters.
    What its engine learned while loading (context, chat template, vector size) is passed
    in; settings fill the rest."""
    base = ServedModel(
        name=settings.model_name,
        base=settings.model_name,
        runner=settings.runner,
        tokenizer=settings.tokenizer_name,
        max_model_len=max_model_len or settings.max_model_len,
        chat_template=chat_template,
        tool_call_parser=settings.tool_call_parser if settings.runner == "generate" else None,
        embedding_size=embedding_size,
        supports_dimensions=supports_dimensions,
    )
    adapters = [
        dataclasses.replace(base, name=name, adapter=path)
        for name, path in sorted(settings.lora_adapters.items())
    ]
    return [base, *adapters]


def announced_by(settings: Settings) -> list[ServedModel]:
    """The names INFERQ_ANNOUNCE_MODELS lists, as each model's workers announce them as
    they start (`served_by`), so a deployment knows them before any worker is up."""
    return [
        model
        for model_settings in settings.announced_model_settings()
        for model in served_by(model_settings)
    ]
