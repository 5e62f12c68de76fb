"""The model catalog: which names requests may use, learned from what workers registered."""

from __future__ import annotations

import pytest

from inferq.domain.served_models import ServedModel, served_by
from inferq.exceptions import InvalidRequest, ModelNotFound, ModelUnavailable
from inferq.settings import Settings
from inferq.wire.model_catalog import REFRESH_S, ModelCatalog, RequestLimits
from inferq.wire.prompts import PromptRenderer

LIMITS = RequestLimits(default_max_tokens=16, max_n=2, max_tokens_cap=64)


class Registered:
    """What Postgres holds, changed by the test; counts the reads."""

    def __init__(self, *models: ServedModel) -> None:
        self.models = list(models)
        self.reads = 0

    def all(self) -> list[ServedModel]:
        self.reads += 1
        return list(self.models)


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def model(name: str, *, base: str | None = None, runner: str = "generate") -> ServedModel:
    return ServedModel(
        name=name,
        base=base or name,
        runner="pooling" if runner == "pooling" else "generate",
        tokenizer="tok",
        max_model_len=128,
        adapter="/adapters/x" if base else None,
    )


@pytest.fixture
def loads(renderer: PromptRenderer) -> list[ServedModel]:
    return []


def catalog(
    source: Registered, renderer: PromptRenderer, loads: list[ServedModel], clock: Clock
) -> ModelCatalog:
    def load(served: ServedModel) -> PromptRenderer:
        loads.append(served)
        return renderer

    return ModelCatalog(source, limits=LIMITS, load=load, clock=clock)


def test_a_registered_name_is_ready_with_its_validator_and_adapters_share_a_tokenizer(
    renderer: PromptRenderer, loads: list[ServedModel]
) -> None:
    source = Registered(model("llama"), model("sql", base="llama"))
    models = catalog(source, renderer, loads, Clock())
    spec = models.get("sql").validator.spec(
        model="sql", prompt="hi", messages=None, sampling=_sampling(), metadata={}
    )
    assert spec.model == "sql"
    assert spec.served_by == "llama"  # an adapter's jobs go to its base's queues
    assert (
        models.get("llama")
        .validator.spec(model=None, prompt="hi", messages=None, sampling=_sampling(), metadata={})
        .served_by
        == "llama"
    )
    assert len(loads) == 1  # one tokenizer for the base and its adapter


def test_a_name_never_registered_is_looked_up_once_then_refused(
    renderer: PromptRenderer, loads: list[ServedModel]
) -> None:
    source = Registered(model("llama"))
    clock = Clock()
    models = catalog(source, renderer, loads, clock)
    models.get("llama")
    reads = source.reads
    clock.now += 1
    with pytest.raises(ModelNotFound, match="'ghost' is not served here"):
        models.get("ghost")
    assert source.reads == reads + 1
    with pytest.raises(ModelNotFound):
        models.get("ghost")  # asked again at once: not read again
    assert source.reads == reads + 1
    # A worker registers it: the next ask, a moment later, finds it.
    source.models.append(model("ghost"))
    clock.now += 1
    assert models.get("ghost").info.name == "ghost"


def test_a_known_name_is_answered_from_memory_until_it_is_stale(
    renderer: PromptRenderer, loads: list[ServedModel]
) -> None:
    source = Registered(model("llama"))
    clock = Clock()
    models = catalog(source, renderer, loads, clock)
    assert models.cached("llama") is None  # nothing read yet
    models.get("llama")
    assert models.cached("llama") is not None
    clock.now += REFRESH_S + 1
    assert models.cached("llama") is None  # the route asks again, off the event loop
    # What a worker registered anew (a longer context) replaces what was known.
    source.models = [ServedModel(**{**model("llama").__dict__, "max_model_len": 256})]
    assert models.get("llama").info.max_model_len == 256


def test_a_request_without_a_model_takes_the_only_one_of_its_kind(
    renderer: PromptRenderer, loads: list[ServedModel]
) -> None:
    source = Registered(model("llama"), model("sql", base="llama"), model("bge", runner="pooling"))
    models = catalog(source, renderer, loads, Clock())
    assert models.get(None).info.name == "llama"
    assert models.get(None, runner="pooling").info.name == "bge"
    source.models.append(model("mistral"))
    models = catalog(source, renderer, loads, Clock())
    with pytest.raises(InvalidRequest, match=r"`model` is required.*llama, mistral") as refused:
        models.get(None)
    assert refused.value.param == "model"


def test_a_model_of_the_other_runner_is_refused_saying_what_it_serves(
    renderer: PromptRenderer, loads: list[ServedModel]
) -> None:
    models = catalog(Registered(model("bge", runner="pooling")), renderer, loads, Clock())
    with pytest.raises(InvalidRequest, match="serves embeddings") as refused:
        models.get("bge")
    assert refused.value.code == "model_not_supported"
    with pytest.raises(ModelNotFound, match="no model serving completions"):
        models.get(None)


def test_a_worker_registers_its_model_and_each_adapter() -> None:
    settings = Settings(
        served_model_name="llama",
        model="/models/llama",
        lora_adapters="sql=/adapters/sql,support=org/support",  # type: ignore[arg-type]
    )
    base, sql, support = served_by(settings, max_model_len=4096, chat_template="{{ x }}")
    assert (base.name, base.base, base.adapter, base.max_model_len) == (
        "llama",
        "llama",
        None,
        4096,
    )
    assert (sql.name, sql.base, sql.adapter) == ("sql", "llama", "/adapters/sql")
    assert support.adapter == "org/support"
    assert support.chat_template == "{{ x }}"


def _sampling():  # type: ignore[no-untyped-def]
    from inferq.wire.sampling_fields import SamplingFields

    return SamplingFields(max_tokens=4)


def test_warming_loads_every_tokenizer_and_skips_one_that_cannot_load(
    renderer: PromptRenderer,
) -> None:
    loaded: list[str] = []

    def load(served: ServedModel) -> PromptRenderer:
        if served.tokenizer == "missing":
            raise OSError("no such tokenizer")
        loaded.append(served.name)
        return renderer

    broken = ServedModel(
        name="broken", base="broken", runner="generate", tokenizer="missing", max_model_len=None
    )
    source = Registered(model("llama"), broken)
    models = ModelCatalog(source, limits=LIMITS, load=load, clock=Clock())
    models.warm()
    assert loaded == ["llama"]
    assert models.cached("llama") is not None  # the first request finds it ready
    with pytest.raises(ModelUnavailable, match=r"'broken' .*no such tokenizer"):
        models.get("broken")
