"""The one typed settings object, read from `INFERQ_*` environment variables."""

from __future__ import annotations

import ipaddress
import json
from typing import Annotated, Any, Literal

from pydantic import ByteSize, Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from sqlalchemy.engine import make_url

DEFAULT_MODEL = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
# vLLM 0.32 sizes its LoRA buffers for these ranks only (vllm/config/lora.py).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


class Settings(BaseSettings):
    """Everything inferq can be told; each field is `INFERQ_<NAME>` in the environment."""

    # An empty variable counts as unset, so compose files can pass `${VAR:-}` through.
    model_config = SettingsConfigDict(
        env_prefix="INFERQ_", extra="ignore", frozen=True, env_ignore_empty=True
    )

    environment: Literal["development", "production"] = Field(
        "production",
        description="`development` allows auth off and placeholder secrets; never in production.",
    )

    # Where state lives.
    database_password: SecretStr | None = Field(
        None,
        description=(
            "Password of the database URL's user, if not in the URL: any characters, where "
            "the URL would need `@ / : # %` percent-encoded."
        ),
    )
    database_url: str = Field(
        "postgresql+psycopg://postgres@127.0.0.1:5432/inferq",
        description="SQLAlchemy URL of the Postgres database that holds every job and result.",
    )
    redis_url: str = Field(
        "redis://127.0.0.1:6379/0", description="Redis that carries work (the Celery broker)."
    )
    redis_key_prefix: str = Field(
        "inferq:", description="Prefix of every Redis key inferq and Celery write."
    )

    # The model and vLLM's engine.
    model: str = Field(DEFAULT_MODEL, description="Hugging Face id or local path of the model.")
    served_model_name: str | None = Field(
        None, description="Name clients use in `model`; defaults to `model`."
    )
    tokenizer: str | None = Field(None, description="Tokenizer id or path; defaults to `model`.")
    max_model_len: int | None = Field(
        None, ge=16, description="Context length in tokens; defaults to the model's own."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Fraction of GPU memory vLLM may use (not used on a CPU)."
    )
    max_num_seqs: int = Field(
        256, ge=1, description="Most sequences in flight in the engine for batch lines."
    )
    interactive_seqs: int | None = Field(
        None,
        ge=0,
        description="Engine slots on top of max_num_seqs that only single jobs use, so one "
        "never waits for a full engine of batch lines; max_num_seqs / 8 (at least 1) if unset.",
    )
    kv_cache_memory_bytes: ByteSize | None = Field(
        None,
        description="KV-cache size (`4GiB`, `512MiB` or bytes). Unset: on a CPU, what "
        "max_num_seqs sequences of max_model_len need, at most half of what is free after the "
        "weights; on a "
        "GPU, what gpu_memory_utilization leaves after the weights.",
    )
    max_num_batched_tokens: int | None = Field(
        None, ge=1, description="Most tokens in one engine step; vLLM chooses when unset."
    )
    tensor_parallel_size: int = Field(1, ge=1, description="GPUs one model is split across.")
    quantization: str | None = Field(
        None, description="vLLM quantization method (`awq`, `gptq`, ...); detected when unset."
    )
    dtype: str = Field(
        "auto", description="Activation dtype (`auto`, `bfloat16`, `float16`, `float32`)."
    )
    enable_prefix_caching: bool = Field(True, description="Reuse KV cache of shared prefixes.")
    enforce_eager: bool = Field(
        False, description="Skip CUDA graphs and compilation: slower, but starts sooner."
    )
    engine_seed: int = Field(0, description="Engine seed, for reproducible unseeded sampling.")
    tool_call_parser: str | None = Field(
        "llama3_json",
        description="vLLM's tool-call parser for the model family (`llama3_json`, `hermes`, "
        "`mistral`, ...), which reads calls out of chats with `tools` and `tool_choice` auto; "
        "`none` refuses tool_choice auto.",
    )
    engine_extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vLLM engine arguments, as a JSON object.",
    )
    engine_step_timeout_s: float = Field(
        300, gt=0, description="An engine step longer than this is a hang: the engine restarts."
    )
    max_engine_deaths: int = Field(
        3, ge=1, description="Engine deaths a request may see before it fails as poison."
    )
    fault_kill_engine_seed: int | None = Field(
        None,
        description="Testing only: a request with this seed kills the engine (fault injection).",
    )
    runner: Literal["generate", "pooling"] = Field(
        "generate",
        description="`generate` serves completions; `pooling` serves embeddings (`/v1/embeddings`) "
        "through vLLM's pooling runner.",
    )
    lora_adapters: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description="LoRA adapters of the model, each served as its own model name: "
        "`name=path-or-hf-id` pairs, comma-separated (or a JSON object).",
    )
    max_loras: int = Field(4, ge=1, description="Most LoRA adapters in one engine step.")
    max_lora_rank: int = Field(
        16,
        description="Largest LoRA rank an adapter may have: "
        + ", ".join(map(str, LORA_RANKS))
        + " (what vLLM allows).",
    )
    engine: Literal["vllm", "instant"] = Field(
        "vllm",
        description="`vllm`; `instant` answers without a model and exists only for benchmarks.",
    )

    # Admission: how queued jobs enter the engine.
    max_batch_size: int = Field(
        64, ge=1, description="Most requests admitted into the engine at one step."
    )
    max_batch_delay_ms: int = Field(
        5, ge=0, description="How long an idle engine waits to fill a micro-batch."
    )

    # Worker.
    worker_concurrency: int | None = Field(
        None,
        ge=1,
        description="Messages a GPU worker holds at once; max_num_seqs + interactive_seqs + "
        "max_batch_size if unset.",
    )
    bulk_chunk_size: int | None = Field(
        None,
        ge=1,
        description="Batch-file jobs carried by one message; max_batch_size if unset.",
    )
    lease_s: int = Field(
        60, ge=3, description="A running job's lease; its worker renews it while alive."
    )
    visibility_timeout_s: int = Field(
        7200,
        ge=60,
        description="Seconds before Redis redelivers an unacknowledged message.",
    )
    requeue_after_s: int = Field(
        6 * 3600,
        ge=60,
        description="A queued job not taken for this long is published again (lost message).",
    )
    drain_timeout_s: float = Field(
        60, ge=0, description="On SIGTERM, how long a worker lets in-flight jobs finish."
    )
    maintenance_interval_s: float = Field(
        15, gt=0, description="How often `inferq beat` schedules maintenance."
    )
    max_batch_lines: int = Field(
        50_000, ge=1, description="Most lines in one batch file; more fail the batch."
    )
    max_file_bytes: int = Field(
        200 * 1024 * 1024, ge=1024, description="Largest file upload (413 above it)."
    )
    idempotency_ttl_s: int = Field(
        86400, ge=60, description="How long an Idempotency-Key is remembered."
    )
    job_retention_s: int = Field(
        30 * 86400,
        ge=0,
        description="How long a job is kept after it ends; also the default expiry of "
        "uploaded files and of a batch's lines, results and files once it ends (a request's "
        "`expires_after` / `output_expires_after` overrides it). 0 keeps them.",
    )
    webhook_retention_s: int = Field(
        7 * 86400,
        ge=0,
        description="How long a webhook delivery and its attempts are kept after it ends "
        "(0 keeps them).",
    )
    result_flush_ms: int = Field(
        20,
        ge=0,
        description="Least time between two bulk writes of results (a result after a quiet "
        "spell is written at once).",
    )
    stream_max_entries: int = Field(
        20_000,
        ge=16,
        description="Most entries kept in a streamed job's Redis Stream of tokens (one entry "
        "carries every token a choice made since the last); older ones are trimmed.",
    )
    stream_ttl_s: int = Field(
        600,
        ge=10,
        description="How long a streamed job's tokens stay in Redis after the last one, for "
        "late readers of /v1/jobs/{id}/stream (the result stays in Postgres).",
    )

    worker_metrics_port: int = Field(
        9400, ge=0, le=65535, description="Port of the GPU worker's Prometheus metrics (0: off)."
    )

    # Requests.
    default_max_tokens: int = Field(
        256, ge=1, description="`max_tokens` when a request gives none (capped by the context)."
    )
    max_n: int = Field(16, ge=1, description="Largest `n` (completions per request) accepted.")
    max_wait_s: int = Field(120, ge=0, description="Longest `?wait=` a client may ask for.")

    # Security and limits.
    auth_enabled: bool = Field(
        True, description="Require an API key on /v1 routes (off only in development)."
    )
    bootstrap_admin_key: SecretStr | None = Field(
        None,
        description="An admin API key the API creates at start if missing (at least 32 chars).",
    )
    auth_cache_s: float = Field(
        5, ge=0, description="How long a checked API key is trusted before it is looked up again."
    )
    max_request_bytes: int = Field(
        1_048_576, ge=1024, description="Largest JSON request body (413 above it)."
    )
    max_tokens_cap: int = Field(
        8192, ge=1, description="Largest `max_tokens` a request may ask for."
    )
    rate_limit_rpm: int = Field(
        1200, ge=0, description="Requests per minute per API key (0: no limit); keys may override."
    )
    rate_limit_tpm: int = Field(
        2_000_000,
        ge=0,
        description="Prompt + max tokens per minute per API key for jobs (0: no limit).",
    )
    interactive_high_water: int = Field(
        5000,
        ge=1,
        description="Queued interactive messages past which new jobs get 429 (batches still go).",
    )
    flower_basic_auth: SecretStr | None = Field(
        None, description="`user:password` for Flower; `inferq flower` refuses to start without."
    )
    flower_port: int = Field(5555, ge=1, le=65535, description="Port Flower listens on.")

    # Webhooks.
    webhook_allowed_networks: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Private networks webhooks may reach (comma-separated CIDRs, e.g. "
        "`10.0.0.0/8`); by default only public addresses are.",
    )
    webhook_timeout_s: float = Field(
        15, gt=0, description="How long a webhook receiver has to answer."
    )
    webhook_retry_schedule_s: Annotated[list[float], NoDecode] = Field(
        default_factory=lambda: [0.0, 5, 300, 1800, 7200, 18000, 36000, 36000],
        description="Delay before each delivery attempt, comma-separated (jittered by 10%); "
        "after the last, a delivery is dead-lettered.",
    )
    webhook_secret_overlap_s: int = Field(
        86400, ge=0, description="After a secret rotation, how long the old secret also signs."
    )
    webhook_concurrency: int = Field(
        16, ge=1, description="Webhooks one delivery worker sends at once."
    )

    # API.
    api_host: str = Field("0.0.0.0", description="Address the API listens on.")  # noqa: S104
    api_port: int = Field(8000, ge=1, le=65535, description="Port the API listens on.")
    api_workers: int = Field(1, ge=1, description="Uvicorn worker processes for the API.")
    api_keep_alive_s: int = Field(
        75,
        ge=1,
        description="Idle keep-alive of API connections; keep it above your load balancer's.",
    )
    api_url: str = Field("http://127.0.0.1:8000", description="Where the CLI finds the API.")
    log_level: str = Field("INFO", description="Log level of every process.")
    log_json: bool = Field(
        False, description="Log one JSON object per line, with job and batch ids as fields."
    )

    @field_validator("engine_extra_args", mode="before")
    @classmethod
    def _parse_json_object(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("lora_adapters", mode="before")
    @classmethod
    def _name_value_pairs(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        if value.strip().startswith("{"):
            return json.loads(value)
        pairs = {}
        for part in (p.strip() for p in value.split(",")):
            name, sep, path = part.partition("=")
            if part and (not sep or not name.strip() or not path.strip()):
                raise ValueError(f"{part!r} is not name=path")
            if part:
                pairs[name.strip()] = path.strip()
        return pairs

    @field_validator("max_lora_rank")
    @classmethod
    def _lora_rank(cls, value: int) -> int:
        if value not in LORA_RANKS:
            raise ValueError(f"must be one of {', '.join(map(str, LORA_RANKS))}")
        return value

    @field_validator("tool_call_parser")
    @classmethod
    def _no_parser(cls, value: str | None) -> str | None:
        # An empty value is ignored (the default stands): `none` is how to have no parser.
        return None if value is not None and value.lower() == "none" else value

    @field_validator("served_model_name")
    @classmethod
    def _plain_name(cls, value: str | None) -> str | None:
        if value is not None and ("," in value or not value.strip()):
            raise ValueError("a served model name must not be empty or hold a comma")
        return value

    @field_validator("webhook_allowed_networks", "webhook_retry_schedule_s", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        for network in value:
            ipaddress.ip_network(network, strict=False)  # ValueError says what is wrong
        return value

    @field_validator("webhook_retry_schedule_s")
    @classmethod
    def _schedule(cls, value: list[float]) -> list[float]:
        if not value or any(delay < 0 for delay in value):
            raise ValueError("needs at least one delay, none negative")
        return value

    @field_validator("database_url")
    @classmethod
    def _password_into_the_url(cls, value: str, info: ValidationInfo) -> str:
        password = info.data.get("database_password")
        if password is None:
            return value
        # Rendered, the URL quotes what it cannot hold as it is.
        url = make_url(value).set(password=password.get_secret_value())
        return url.render_as_string(hide_password=False)

    @model_validator(mode="after")
    def _consistent_timeouts(self) -> Settings:
        # Redis redelivers a message that stayed unacknowledged this long, even if its job
        # is still running; leases, not redelivery, are how lost work comes back, so the
        # visibility timeout must stay far above anything a worker waits for.
        floor = max(4 * self.lease_s, 2 * self.drain_timeout_s, 2 * self.engine_step_timeout_s)
        if self.visibility_timeout_s < floor:
            raise ValueError(
                f"INFERQ_VISIBILITY_TIMEOUT_S is {self.visibility_timeout_s}, but must be at least "
                f"{floor:g} (4 leases, 2 drain timeouts and 2 engine step timeouts)"
            )
        return self

    @model_validator(mode="after")
    def _adapters_named_apart(self) -> Settings:
        for name in self.lora_adapters:
            if name == self.model_name or "," in name:
                raise ValueError(
                    f"INFERQ_LORA_ADAPTERS: adapter name {name!r} must differ from the model's "
                    "served name and hold no comma"
                )
        if self.lora_adapters and self.runner == "pooling":
            raise ValueError("INFERQ_LORA_ADAPTERS needs INFERQ_RUNNER=generate")
        return self

    @model_validator(mode="after")
    def _safe_outside_development(self) -> Settings:
        if self.environment == "development":
            return self
        if not self.auth_enabled:
            raise ValueError(
                "INFERQ_AUTH_ENABLED=false leaves every tenant's data open; it is allowed only "
                "with INFERQ_ENVIRONMENT=development"
            )
        key = self.bootstrap_admin_key
        if key is not None and (why := _weak(key.get_secret_value(), at_least=32)):
            raise ValueError(
                f"INFERQ_BOOTSTRAP_ADMIN_KEY {why}: generate one with `openssl rand -hex 32`"
            )
        auth = self.flower_basic_auth
        if auth is not None:
            user, colon, password = auth.get_secret_value().partition(":")
            if not user or not colon:
                raise ValueError(
                    "INFERQ_FLOWER_BASIC_AUTH must be user:password (a user name, a colon, "
                    "then a password)"
                )
            if why := _weak(password, at_least=12):
                raise ValueError(
                    f"INFERQ_FLOWER_BASIC_AUTH's password {why}: use a real one, such as "
                    "`openssl rand -hex 12`"
                )
        return self

    @property
    def model_name(self) -> str:
        """The name clients put in `model`."""
        return self.served_model_name or self.model

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer or self.model

    @property
    def effective_interactive_seqs(self) -> int:
        if self.interactive_seqs is not None:
            return self.interactive_seqs
        return max(1, self.max_num_seqs // 8)

    @property
    def engine_max_num_seqs(self) -> int:
        """The engine's own `max_num_seqs`: batch lines' slots plus single jobs'."""
        return self.max_num_seqs + self.effective_interactive_seqs

    @property
    def effective_worker_concurrency(self) -> int:
        return self.worker_concurrency or self.engine_max_num_seqs + self.max_batch_size

    @property
    def effective_bulk_chunk_size(self) -> int:
        # A message is a micro-batch: the worker's gate holds a full engine plus one.
        return self.bulk_chunk_size or self.max_batch_size


_PLACEHOLDERS = (
    "changeme",
    "change-me",
    "change_me",
    "changethis",
    "secret",
    "password",
    "example",
)


def _weak(secret: str, *, at_least: int) -> str | None:
    """Why `secret` will not do (None: it will)."""
    if len(secret) < at_least:
        return f"is {len(secret)} character{'s' * (len(secret) != 1)}, shorter than {at_least}"
    lowered = secret.lower()
    if word := next((w for w in _PLACEHOLDERS if w in lowered), None):
        return f"contains {word!r}, which placeholders do"
    if len(set(lowered)) <= 2:
        return "repeats one or two characters, as placeholders do"
    return None


def redact_url(value: str) -> str:
    """`value` with the password of a URL in it replaced by `***`."""
    scheme, sep, rest = value.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return value
    return f"{scheme}{sep}{credentials.split(':', 1)[0]}:***@{host}"


def settings_table() -> str:
    """Every setting as a Markdown table: variable, default, meaning (for the README)."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = (
            "(unset)"
            if default is None
            else f"`{json.dumps(default) if isinstance(default, dict) else default}`"
        )
        lines.append(f"| `INFERQ_{name.upper()}` | {shown} | {field.description} |")
    return "\n".join(lines)
