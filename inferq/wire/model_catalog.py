"""The models requests may name: what the GPU workers registered in Postgres
(inferq/domain/served_models.py), each with its tokenizer loaded once and a validator for its
requests. The API and `inferq run` ask it; neither is configured with a model of its own."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from inferq.domain.served_models import Runner, ServedModel
from inferq.exceptions import InvalidRequest, ModelNotFound, ModelUnavailable
from inferq.settings import ApiSettings
from inferq.wire.prompts import PromptRenderer
from inferq.wire.validation import JobValidator

log = logging.getLogger(__name__)

# How long what was read from Postgres is trusted; a name not known yet is looked up at
# once (at most once per UNKNOWN_RETRY_S), so a new worker's model is accepted in a moment.
REFRESH_S = 10.0
UNKNOWN_RETRY_S = 0.5

_WHAT = {"generate": "completions and chats", "pooling": "embeddings (/v1/embeddings)"}


@dataclass(frozen=True, kw_only=True)
class CatalogModel:
    """A served model, ready to check requests for it."""

    info: ServedModel
    renderer: PromptRenderer
    validator: JobValidator


@dataclass(frozen=True, kw_only=True)
class RequestLimits:
    """What every model's validator shares (from settings)."""

    default_max_tokens: int
    max_n: int
    max_tokens_cap: int

    @classmethod
    def from_settings(cls, settings: ApiSettings) -> RequestLimits:
        return cls(
            default_max_tokens=settings.default_max_tokens,
            max_n=settings.max_n,
            max_tokens_cap=settings.max_tokens_cap,
        )


RendererLoader = Callable[[ServedModel], PromptRenderer]


class ModelSource(Protocol):
    """Where registered models are read: Postgres (`inferq.store.served_models.ModelStore`),
    or a fixed list (`FixedModels`)."""

    def all(self) -> list[ServedModel]: ...


class FixedModels:
    """Models known without asking anyone: `inferq run` serves its own, in-process."""

    def __init__(self, models: Sequence[ServedModel]) -> None:
        self._models = list(models)

    def all(self) -> list[ServedModel]:
        return list(self._models)


def load_renderer(model: ServedModel) -> PromptRenderer:
    """The model's tokenizer, context and chat template, as its workers registered them."""
    renderer = PromptRenderer.load(model.tokenizer, max_model_len=model.max_model_len)
    if model.chat_template is not None:
        renderer.use_chat_template(model.chat_template)
    return renderer


class ModelCatalog:
    """Thread-safe: routes ask from the event loop (`cached`) and from worker threads."""

    def __init__(
        self,
        store: ModelSource,
        *,
        limits: RequestLimits,
        load: RendererLoader = load_renderer,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._limits = limits
        self._load = load
        self._clock = clock
        self._lock = threading.Lock()
        self._models: dict[str, ServedModel] = {}
        self._read_at: float | None = None
        # Keyed by what makes a renderer, so adapters share their base's tokenizer.
        self._renderers: dict[tuple[str, int | None, str | None], PromptRenderer] = {}
        self._ready: dict[str, CatalogModel] = {}

    def models(self) -> list[ServedModel]:
        """Every registered model, by name."""
        self._refresh(force=False)
        return sorted(self._models.values(), key=lambda m: m.name)

    def warm(self) -> None:
        """Load every registered model's tokenizer now (at start-up), so no request waits
        for one; a model whose tokenizer cannot be loaded here is left for its first
        request, which then says why."""
        self._refresh(force=False)
        for info in list(self._models.values()):
            try:
                self._prepare(info)
            except ModelUnavailable as exc:  # said now, and to its first request
                log.warning("%s", exc.message)

    def cached(self, name: str | None, *, runner: Runner = "generate") -> CatalogModel | None:
        """The model if it is ready without reading Postgres or loading a tokenizer."""
        read_at = self._read_at
        if read_at is None or self._clock() - read_at > REFRESH_S or name is None:
            return None
        ready = self._ready.get(name)
        if ready is None or ready.info.runner != runner:
            return None
        return ready

    def get(self, name: str | None, *, runner: Runner = "generate") -> CatalogModel:
        """The model `name` (None: the only one serving `runner`), ready; `ModelNotFound`
        for a name never registered, `InvalidRequest` for one of another runner."""
        self._refresh(force=False)
        if name is None:
            name = self._only(runner)
        info = self._models.get(name)
        if info is None:
            self._refresh(force=True)
            info = self._models.get(name)
        if info is None:
            raise ModelNotFound(
                f"model {name!r} is not served here: GET /v1/models lists the models that are"
            )
        if info.runner != runner:
            raise InvalidRequest(
                f"model {name!r} serves {_WHAT[info.runner]}, not {_WHAT[runner]}",
                param="model",
                code="model_not_supported",
            )
        ready = self._ready.get(name)
        if ready is None or ready.info != info:
            ready = self._prepare(info)
        return ready

    def _only(self, runner: Runner) -> str:
        names = [m.name for m in self._models.values() if m.runner == runner and not m.is_adapter]
        if len(names) == 1:
            return names[0]
        if not names:
            raise ModelNotFound(f"no model serving {_WHAT[runner]} is registered yet")
        raise InvalidRequest(
            f"`model` is required: this deployment serves {', '.join(sorted(names))}",
            param="model",
        )

    def _prepare(self, info: ServedModel) -> CatalogModel:
        key = (info.tokenizer, info.max_model_len, info.chat_template)
        with self._lock:  # one load per tokenizer, however many ask at once
            renderer = self._renderers.get(key)
            if renderer is None:
                try:
                    renderer = self._renderers[key] = self._load(info)
                except Exception as exc:  # whatever transformers raises, said in one line
                    reason = " ".join(str(exc).split())[:300]
                    raise ModelUnavailable(
                        f"cannot load the tokenizer of model {info.name!r} ({info.tokenizer}) "
                        f"on this API host: {reason}; the API needs the same model files "
                        "(or Hugging Face access) as the model's workers"
                    ) from exc
            limits = self._limits
            ready = CatalogModel(
                info=info,
                renderer=renderer,
                validator=JobValidator(
                    renderer,
                    model_name=info.name,
                    base=info.base if info.is_adapter else None,
                    default_max_tokens=limits.default_max_tokens,
                    max_n=limits.max_n,
                    max_tokens_cap=limits.max_tokens_cap,
                    tool_call_parser=info.tool_call_parser,
                ),
            )
            self._ready[info.name] = ready
        return ready

    def _refresh(self, *, force: bool) -> None:
        now = self._clock()
        read_at = self._read_at
        if read_at is not None:
            age = now - read_at
            if age < (UNKNOWN_RETRY_S if force else REFRESH_S):
                return
        models = {model.name: model for model in self._store.all()}
        with self._lock:
            self._models = models
            self._ready = {n: r for n, r in self._ready.items() if models.get(n) == r.info}
            self._read_at = now
