"""Settings: the INFERQ_ prefix, and refusing unsafe values outside development."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError
from sqlalchemy.engine import make_url

from inferq.domain.served_models import ServedModel, announced_by, served_by
from inferq.settings import AnnouncedModel, Settings

STRONG = "3f5b2c0e9a7d4e1f8b6c2a9d0e7f4b1c"


def test_settings_come_from_inferq_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_MAX_NUM_SEQS", "32")
    monkeypatch.setenv("INFERQ_ENGINE_EXTRA_ARGS", '{"swap_space": 4}')
    settings = Settings()
    assert settings.max_num_seqs == 32
    assert settings.engine_extra_args == {"swap_space": 4}
    # The engine holds 32 batch lines plus 32 / 8 single jobs; one micro-batch waits.
    assert settings.effective_worker_concurrency == 32 + 4 + 64


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"auth_enabled": False}, "allowed only with INFERQ_ENVIRONMENT=development"),
        (
            {"bootstrap_admin_key": "changeme-changeme-changeme-changeme"},
            "contains 'changeme', which placeholders do",
        ),
        ({"bootstrap_admin_key": "short-but-random-91"}, "is 19 characters, shorter than 32"),
        ({"bootstrap_admin_key": "a" * 40}, "repeats one or two characters"),
        (
            {"flower_basic_auth": "admin:password123456"},
            "password contains 'password', which placeholders do",
        ),
        ({"flower_basic_auth": "admin:x"}, "password is 1 character, shorter than 12"),
        ({"flower_basic_auth": "ops:my-secret-7c1e93ab52"}, "contains 'secret'"),
        ({"flower_basic_auth": ":" + STRONG}, "must be user:password"),
        ({"flower_basic_auth": STRONG}, "must be user:password"),
    ],
)
def test_unsafe_values_are_refused_in_production(values: dict[str, object], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(**values)  # type: ignore[arg-type]


def test_development_allows_them_and_production_takes_real_secrets() -> None:
    assert not Settings(environment="development", auth_enabled=False).auth_enabled
    settings = Settings(bootstrap_admin_key=STRONG, flower_basic_auth=f"ops:{STRONG}")
    assert settings.bootstrap_admin_key is not None
    assert STRONG not in repr(settings)


def test_lora_adapters_are_name_path_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_LORA_ADAPTERS", "a=/x, b=/y")
    assert Settings().lora_adapters == {"a": "/x", "b": "/y"}
    monkeypatch.setenv("INFERQ_LORA_ADAPTERS", '{"c": "org/c"}')
    assert Settings().lora_adapters == {"c": "org/c"}


def test_a_lora_adapter_without_a_path_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_LORA_ADAPTERS", "a")
    with pytest.raises(ValidationError, match="'a' is not name=path"):
        Settings()


def test_a_lora_adapter_named_like_the_model_is_refused() -> None:
    with pytest.raises(ValidationError, match="adapter name 'tiny' must differ from the model"):
        Settings(served_model_name="tiny", lora_adapters={"tiny": "/x"})


def test_a_database_password_of_any_characters_reaches_the_driver_as_given() -> None:
    password = "p@ss/w:rd#1%"  # a URL cannot hold it as it is
    settings = Settings(
        database_url="postgresql+psycopg://inferq@postgres:5432/inferq",
        database_password=password,  # type: ignore[arg-type]
    )
    url = make_url(settings.database_url)
    assert (url.username, url.password, url.host, url.database) == (
        "inferq",
        password,
        "postgres",
        "inferq",
    )
    assert password not in repr(settings)


def test_the_tool_call_parser_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings().tool_call_parser == "llama3_json"
    monkeypatch.setenv("INFERQ_TOOL_CALL_PARSER", "")  # empty values are ignored
    assert Settings().tool_call_parser == "llama3_json"
    monkeypatch.setenv("INFERQ_TOOL_CALL_PARSER", "none")
    assert Settings().tool_call_parser is None


@pytest.mark.parametrize("engine", ["pipeline-only", "paced"])
def test_a_benchmark_engine_is_refused_unless_allowed(
    monkeypatch: pytest.MonkeyPatch, engine: str
) -> None:
    monkeypatch.setenv("INFERQ_ENGINE", engine)
    monkeypatch.setenv("INFERQ_PACED_ENGINE_TABLE", "table.json")
    with pytest.raises(ValidationError) as refused:
        Settings()
    [error] = refused.value.errors()
    assert "placeholder tokens" in error["msg"]
    assert "set INFERQ_ALLOW_BENCHMARK_ENGINE=true" in error["msg"]
    assert "\n" not in error["msg"]
    monkeypatch.setenv("INFERQ_ALLOW_BENCHMARK_ENGINE", "true")
    assert Settings().engine == engine


def test_benchmark_engines_are_still_allowed_by_the_former_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFERQ_ENGINE", "pipeline-only")
    monkeypatch.setenv("INFERQ_ALLOW_PIPELINE_ONLY_ENGINE", "true")
    assert Settings().allow_benchmark_engine
    assert Settings(allow_benchmark_engine=False, engine="vllm").engine == "vllm"


def test_the_paced_engine_needs_its_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_ENGINE", "paced")
    monkeypatch.setenv("INFERQ_ALLOW_BENCHMARK_ENGINE", "true")
    with pytest.raises(ValidationError, match="needs INFERQ_PACED_ENGINE_TABLE"):
        Settings()


def test_the_engine_once_called_instant_is_no_longer_a_choice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFERQ_ENGINE", "instant")
    monkeypatch.setenv("INFERQ_ALLOW_BENCHMARK_ENGINE", "true")
    with pytest.raises(ValidationError, match="'vllm', 'pipeline-only' or 'paced'"):
        Settings()


def test_no_setting_kills_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    # The fault hook is the tests' own (tests/helpers/faulty_worker.py); the variable that
    # once armed it is ignored, as any unknown INFERQ_ variable is.
    monkeypatch.setenv("INFERQ_FAULT_KILL_ENGINE_SEED", "666")
    monkeypatch.setenv("INFERQ_NO_SUCH_SETTING", "1")
    assert "fault_kill_engine_seed" not in Settings().model_dump()


def test_every_group_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # One variable per group, the list and JSON-object ones among them: the groups are
    # plain models, and only Settings reads INFERQ_ variables (NoDecode kept from the groups).
    variables = {
        "INFERQ_REDIS_KEY_PREFIX": "t:",
        "INFERQ_ENGINE_EXTRA_ARGS": '{"swap_space": 4}',
        "INFERQ_LORA_ADAPTERS": "a=/x",
        "INFERQ_ANNOUNCE_MODELS": "m=/m",
        "INFERQ_LEASE_S": "30",
        "INFERQ_MAX_BATCH_LINES": "7",
        "INFERQ_JOB_RETENTION_S": "0",
        "INFERQ_WEBHOOK_ALLOWED_NETWORKS": "10.0.0.0/8, 192.168.0.0/16",
        "INFERQ_WEBHOOK_RETRY_SCHEDULE_S": "1,2.5",
        "INFERQ_MAX_N": "2",
        "INFERQ_FLOWER_PORT": "5556",
        "INFERQ_LOG_JSON": "true",
    }
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.redis_key_prefix == "t:"
    assert settings.engine_extra_args == {"swap_space": 4}
    assert settings.lora_adapters == {"a": "/x"}
    assert settings.announce_models == {"m": AnnouncedModel(model="/m")}
    assert settings.lease_s == 30
    assert settings.max_batch_lines == 7
    assert settings.job_retention_s == 0
    assert settings.webhook_allowed_networks == ["10.0.0.0/8", "192.168.0.0/16"]
    assert settings.webhook_retry_schedule_s == [1.0, 2.5]
    assert settings.max_n == 2
    assert settings.flower_port == 5556
    assert settings.log_json


def test_announced_models_are_name_model_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFERQ_ANNOUNCE_MODELS", "llama=org/llama, bge = /models/bge")
    assert [(m.name, m.base, m.tokenizer, m.runner) for m in announced_by(Settings())] == [
        ("llama", "llama", "org/llama", "generate"),
        ("bge", "bge", "/models/bge", "generate"),
    ]


def test_an_announced_model_is_named_as_its_workers_name_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # What every process shares, and what each model's workers set on top.
    monkeypatch.setenv("INFERQ_MAX_MODEL_LEN", "2048")
    monkeypatch.setenv("INFERQ_TOOL_CALL_PARSER", "hermes")
    monkeypatch.setenv(
        "INFERQ_ANNOUNCE_MODELS",
        """{"llama": {"model": "org/llama", "max_model_len": 8192,
                      "lora_adapters": {"sql": "org/sql-lora"}},
            "bge": {"model": "org/bge", "tokenizer": "org/bge-tok", "runner": "pooling"}}""",
    )
    llama = ServedModel(
        name="llama",
        base="llama",
        runner="generate",
        tokenizer="org/llama",
        max_model_len=8192,
        tool_call_parser="hermes",
    )
    assert announced_by(Settings()) == [
        llama,
        ServedModel(
            name="sql",
            base="llama",
            runner="generate",
            tokenizer="org/llama",
            max_model_len=8192,
            tool_call_parser="hermes",
            adapter="org/sql-lora",
        ),
        ServedModel(
            name="bge", base="bge", runner="pooling", tokenizer="org/bge-tok", max_model_len=2048
        ),
    ]
    # The same as a worker of llama announces as it starts.
    worker = Settings(model="org/llama", served_model_name="llama", max_model_len=8192)
    assert served_by(worker)[0] == llama


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("llama", "'llama' is not name=model"),
        ('{"llama": {"max_model_len": 8192}}', "Field required"),
        ('{"llama": {"model": "x", "max_len": 8192}}', "Extra inputs are not permitted"),
        (
            '{"llama": {"model": "x", "lora_adapters": {"llama": "y"}}}',
            "INFERQ_ANNOUNCE_MODELS: model 'llama': INFERQ_LORA_ADAPTERS: adapter name 'llama' "
            "must differ from the model's served name",
        ),
        (
            '{"llama": {"model": "x", "max_model_len": 8}}',
            "INFERQ_ANNOUNCE_MODELS: model 'llama': max_model_len: Input should be greater than "
            "or equal to 16",
        ),
        ('{"a,b": {"model": "x"}}', "a served model name must not be empty or hold a comma"),
    ],
)
def test_an_announced_model_no_worker_could_serve_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("INFERQ_ANNOUNCE_MODELS", value)
    with pytest.raises(ValidationError, match=re.escape(message)):
        Settings()
