"""The API's settings: what it accepts from whom, how much, and where it listens."""

from __future__ import annotations

from pydantic import BaseModel, Field, SecretStr


class ApiSettings(BaseModel):
    """The API process: request limits, API keys and rate limits, its address."""

    idempotency_ttl_s: int = Field(
        86400, ge=60, description="How long an Idempotency-Key is remembered."
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

    # Where it listens.
    api_host: str = Field("0.0.0.0", description="Address the API listens on.")  # noqa: S104
    api_port: int = Field(8000, ge=1, le=65535, description="Port the API listens on.")
    api_workers: int = Field(1, ge=1, description="Uvicorn worker processes for the API.")
    api_keep_alive_s: int = Field(
        75,
        ge=1,
        description="Idle keep-alive of API connections; keep it above your load balancer's.",
    )
    api_url: str = Field("http://127.0.0.1:8000", description="Where the CLI finds the API.")


class BatchFileSettings(BaseModel):
    """Uploaded files and the batches made of them (the API checks them, the housekeeper
    splits them into jobs)."""

    max_batch_lines: int = Field(
        50_000, ge=1, description="Most lines in one batch file; more fail the batch."
    )
    max_file_bytes: int = Field(
        200 * 1024 * 1024, ge=1024, description="Largest file upload (413 above it)."
    )
