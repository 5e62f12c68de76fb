"""ORM rows. They stay inside `inferq.store`: the stores convert them to domain objects."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from inferq.store.text_codec import StoredText

# JSONB on Postgres, JSON text elsewhere (SQLite, for `inferq run`).
Json = JSON().with_variant(JSONB(), "postgresql")
Timestamp = DateTime(timezone=True)

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    # The Celery queue it is published to (inferq/broker/queues.py).
    queue: Mapped[str] = mapped_column(Text)
    model: Mapped[str] = mapped_column(Text)
    # User text is StoredText and Json: NUL and all (inferq.store.text_codec).
    prompt: Mapped[str | None] = mapped_column(StoredText)
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(Json)
    prompt_token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    sampling: Mapped[dict[str, Any]] = mapped_column(Json)
    metadata_: Mapped[dict[str, Any]] = mapped_column("metadata", Json)
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)
    lease_expires_at: Mapped[datetime | None] = mapped_column(Timestamp)
    published_at: Mapped[datetime] = mapped_column(Timestamp)
    worker: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    choices: Mapped[list[dict[str, Any]] | None] = mapped_column(Json)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[dict[str, str] | None] = mapped_column(Json)
    batch_id: Mapped[str | None] = mapped_column(String(64))
    line: Mapped[int | None] = mapped_column(Integer)
    custom_id: Mapped[str | None] = mapped_column(StoredText)
    webhook_endpoint_id: Mapped[str | None] = mapped_column(String(64))
    webhook_events: Mapped[list[str] | None] = mapped_column(Json)
    priority: Mapped[int] = mapped_column(SmallInteger, default=0, server_default="0")
    stream: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    # An embedding job's vectors (inferq.domain.jobs.JobResult.embedding).
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)
    # A request to OpenAI's Responses API: what its response echoes (JobSpec.response).
    response: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # The API key it was submitted with (None: before keys were recorded, or `inferq run`),
    # and the most it can cost: prompt plus `max_tokens` times `n` (a key's queued tokens).
    key_id: Mapped[str | None] = mapped_column(String(64))
    cost_tokens: Mapped[int | None] = mapped_column(BigInteger)

    __table_args__ = (
        Index("ix_jobs_status_id", "status", "id"),
        Index("ix_jobs_batch_id_line", "batch_id", "line"),
        # A batch's lines still to run, in order: whether it has any, and the first after
        # a cursor (a follower's read), without scanning the others.
        Index(
            "ix_jobs_batch_active",
            "batch_id",
            "line",
            postgresql_where=text("status IN ('queued', 'running') AND batch_id IS NOT NULL"),
            sqlite_where=text("status IN ('queued', 'running') AND batch_id IS NOT NULL"),
        ),
        # A batch's queued lines by queue, in input order: what a claim of lines reads.
        Index(
            "ix_jobs_batch_queued",
            "batch_id",
            "queue",
            "line",
            postgresql_where=text("status = 'queued' AND batch_id IS NOT NULL"),
            sqlite_where=text("status = 'queued' AND batch_id IS NOT NULL"),
        ),
        Index("ix_jobs_tenant_id", "tenant", "id"),
        # What a quota sums at submission: a key's queued and running jobs' costs.
        Index(
            "ix_jobs_key_active",
            "key_id",
            "cost_tokens",
            postgresql_where=text("status IN ('queued', 'running')"),
            sqlite_where=text("status IN ('queued', 'running')"),
        ),
        # What a model's autoscaler counts (deploy/k8s/scaledobject-*.yaml): the jobs not yet
        # ended on its queues, whoever holds them, without reading the others.
        Index(
            "ix_jobs_queue_active",
            "queue",
            postgresql_where=text("status IN ('queued', 'running')"),
            sqlite_where=text("status IN ('queued', 'running')"),
        ),
        # What maintenance scans: the few jobs not yet finished, by lease.
        Index(
            "ix_jobs_active_lease",
            "lease_expires_at",
            postgresql_where=text("status IN ('queued', 'running')"),
            sqlite_where=text("status IN ('queued', 'running')"),
        ),
        # Queued jobs by queue and when they were last published: those maintenance finds
        # unclaimed (their message delivered, the job never claimed) or stuck (waiting
        # while workers have room), without reading the jobs that ran.
        Index(
            "ix_jobs_queued_published",
            "queue",
            "published_at",
            postgresql_where=text("status = 'queued'"),
            sqlite_where=text("status = 'queued'"),
        ),
        # What retention scans: single jobs that have ended, oldest first.
        Index(
            "ix_jobs_single_finished",
            "finished_at",
            postgresql_where=text("batch_id IS NULL AND finished_at IS NOT NULL"),
            sqlite_where=text("batch_id IS NULL AND finished_at IS NOT NULL"),
        ),
    )


class UsageRow(Base):
    """What a tenant's key used of a model in an hour (UTC), added to by the transactions
    that end jobs and create batches. Retention never deletes these rows."""

    __tablename__ = "usage"

    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    # "" for work no key submitted (`inferq run`, or before keys were recorded).
    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    model: Mapped[str] = mapped_column(Text, primary_key=True)
    hour: Mapped[datetime] = mapped_column(Timestamp, primary_key=True)
    # Prompt tokens of generation, tokens generated, and tokens embedded (embeddings).
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    embedding_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Single jobs and batch lines that ended (however), and batches created.
    jobs: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    batch_lines: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    batches: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")

    __table_args__ = (
        Index("ix_usage_hour", "hour"),
        Index("ix_usage_key_id_hour", "key_id", "hour"),
    )


class ServedModelRow(Base):
    """A model name clients may use, as the workers that serve it registered it."""

    __tablename__ = "served_models"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    base: Mapped[str] = mapped_column(Text)
    runner: Mapped[str] = mapped_column(String(16))
    tokenizer: Mapped[str] = mapped_column(Text)
    max_model_len: Mapped[int | None] = mapped_column(Integer)
    chat_template: Mapped[str | None] = mapped_column(Text)
    tool_call_parser: Mapped[str | None] = mapped_column(Text)
    adapter: Mapped[str | None] = mapped_column(Text)
    embedding_size: Mapped[int | None] = mapped_column(Integer)
    supports_dimensions: Mapped[bool] = mapped_column(Boolean)
    registered_at: Mapped[datetime] = mapped_column(Timestamp)


class EngineSpeedRow(Base):
    """What a GPU worker measured of its engine, replaced at each of its reports; the rows
    of workers gone stay (the newest stands in while none is live)."""

    __tablename__ = "engine_speeds"

    worker: Mapped[str] = mapped_column(Text, primary_key=True)
    model: Mapped[str] = mapped_column(Text, index=True)
    runner: Mapped[str] = mapped_column(String(16))
    tokens_per_s: Mapped[float] = mapped_column(Float)
    # How much longer than its tokens at the full rate a step with few sequences takes
    # (a batch's last lines pay it a token).
    step_s: Mapped[float | None] = mapped_column(Float)
    output_fraction: Mapped[float | None] = mapped_column(Float)
    interactive_tokens_per_s: Mapped[float] = mapped_column(Float)
    reported_at: Mapped[datetime] = mapped_column(Timestamp)
    # Whether `tokens_per_s` was measured with the engine at load (False: at whatever load
    # it had, which says little of what a large batch gets).
    at_load: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))


class ApiKeyRow(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    tenant: Mapped[str] = mapped_column(String(128))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    admin: Mapped[bool] = mapped_column(Boolean)
    rpm: Mapped[int | None] = mapped_column(Integer)
    tpm: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    revoked_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # Quotas (None: none): tokens queued or running at once, and tokens a UTC day.
    max_queued_tokens: Mapped[int | None] = mapped_column(BigInteger)
    daily_tokens: Mapped[int | None] = mapped_column(BigInteger)
    # Its tenant's share of batch work against other tenants' (the largest of the
    # tenant's live keys counts; inferq/domain/fair_share.py).
    weight: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class ShareClockRow(Base):
    """Where the share of a queue's batch work has got to: the virtual time a tenant whose
    batches start (or start again) joins at, so it gets no credit for time it was away.
    Its row is locked while a worker claims, so claims of one queue take turns."""

    __tablename__ = "share_clocks"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    clock: Mapped[float] = mapped_column(Float)


class ShareRow(Base):
    """A tenant's place in the share of a queue's batch work: the virtual time its lines
    claimed so far finish at (each line adds 1 / its weight)."""

    __tablename__ = "shares"

    queue: Mapped[str] = mapped_column(Text, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), primary_key=True)
    finish: Mapped[float] = mapped_column(Float)


class IdempotencyKeyRow(Base):
    __tablename__ = "idempotency_keys"

    key_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))
    status_code: Mapped[int | None] = mapped_column(Integer)
    response: Mapped[dict[str, Any] | None] = mapped_column(Json)
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    expires_at: Mapped[datetime] = mapped_column(Timestamp, index=True)


class FileRow(Base):
    __tablename__ = "files"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(StoredText)
    # None: a batch's output or error file whose size is not measured yet.
    bytes: Mapped[int | None] = mapped_column(BigInteger)
    lines: Mapped[int] = mapped_column(Integer)
    batch_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    deleted_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # When retention deletes it (None: kept until deleted by hand).
    expires_at: Mapped[datetime | None] = mapped_column(Timestamp)

    __table_args__ = (
        Index("ix_files_tenant_id", "tenant", "id"),
        Index(
            "ix_files_expires_at",
            "expires_at",
            postgresql_where=text("expires_at IS NOT NULL"),
            sqlite_where=text("expires_at IS NOT NULL"),
        ),
    )


class FileChunkRow(Base):
    __tablename__ = "file_chunks"

    file_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("files.id", ondelete="CASCADE"), primary_key=True
    )
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class BatchRow(Base):
    __tablename__ = "batches"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    endpoint: Mapped[str] = mapped_column(String(64))
    input_file_id: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16), index=True)
    model: Mapped[str | None] = mapped_column(Text)
    metadata_: Mapped[dict[str, str]] = mapped_column("metadata", Json)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(Json)
    output_file_id: Mapped[str | None] = mapped_column(String(64))
    error_file_id: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    expires_at: Mapped[datetime] = mapped_column(Timestamp)
    in_progress_at: Mapped[datetime | None] = mapped_column(Timestamp)
    finalizing_at: Mapped[datetime | None] = mapped_column(Timestamp)
    completed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    failed_at: Mapped[datetime | None] = mapped_column(Timestamp)
    expired_at: Mapped[datetime | None] = mapped_column(Timestamp)
    cancelling_at: Mapped[datetime | None] = mapped_column(Timestamp)
    cancelled_at: Mapped[datetime | None] = mapped_column(Timestamp)
    webhook_endpoint_id: Mapped[str | None] = mapped_column(String(64))
    webhook_events: Mapped[list[str] | None] = mapped_column(Json)
    priority: Mapped[int] = mapped_column(SmallInteger, default=0, server_default="0")
    # Kept up to date as lines end, so reading a batch counts nothing.
    request_total: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_completed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    request_failed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # `output_expires_after.seconds`, and when that makes the batch's lines, results and
    # files go (set once it ends; None: kept).
    output_expires_after_s: Mapped[int | None] = mapped_column(Integer)
    output_expires_at: Mapped[datetime | None] = mapped_column(Timestamp)
    # What its lines ask of the engine, summed when it is written: their prompt tokens,
    # and their `max_tokens` (times `n`); and when it is expected to end, made then and
    # again while it runs (inferq/domain/estimates.py; None: nothing measured yet).
    line_prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    line_max_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The largest `max_tokens` of a line: how long its last line may keep it running.
    line_longest_tokens: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    estimate: Mapped[dict[str, Any] | None] = mapped_column(Json)
    # The API key that created it (its lines carry it too).
    key_id: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (
        Index("ix_batches_tenant_id", "tenant", "id"),
        Index(
            "ix_batches_output_expires_at",
            "output_expires_at",
            postgresql_where=text("output_expires_at IS NOT NULL"),
            sqlite_where=text("output_expires_at IS NOT NULL"),
        ),
    )


class WebhookEndpointRow(Base):
    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    url: Mapped[str] = mapped_column(Text)
    secret: Mapped[str] = mapped_column(String(128))
    previous_secret: Mapped[str | None] = mapped_column(String(128))
    previous_expires_at: Mapped[datetime | None] = mapped_column(Timestamp)
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    disabled_at: Mapped[datetime | None] = mapped_column(Timestamp)
    disabled_reason: Mapped[str | None] = mapped_column(Text)
    # The shape of its events: `WebhookFormat`.
    format: Mapped[str] = mapped_column(String(16), default="inferq", server_default="inferq")

    __table_args__ = (UniqueConstraint("tenant", "url"),)


class WebhookDeliveryRow(Base):
    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128))
    endpoint_id: Mapped[str] = mapped_column(String(64), ForeignKey("webhook_endpoints.id"))
    event: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str | None] = mapped_column(String(64), index=True)
    batch_id: Mapped[str | None] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer)
    next_attempt_at: Mapped[datetime] = mapped_column(Timestamp)
    created_at: Mapped[datetime] = mapped_column(Timestamp)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp)

    __table_args__ = (
        # What retention scans: deliveries that have ended, oldest first.
        Index(
            "ix_webhook_deliveries_finished",
            "finished_at",
            postgresql_where=text("finished_at IS NOT NULL"),
            sqlite_where=text("finished_at IS NOT NULL"),
        ),
        # What the delivery loop scans: the few deliveries not yet ended, by due time.
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("state IN ('pending', 'delivering')"),
            sqlite_where=text("state IN ('pending', 'delivering')"),
        ),
        Index("ix_webhook_deliveries_tenant_id", "tenant", "id"),
    )


class WebhookAttemptRow(Base):
    __tablename__ = "webhook_attempts"

    delivery_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), primary_key=True
    )
    number: Mapped[int] = mapped_column(Integer, primary_key=True)
    started_at: Mapped[datetime] = mapped_column(Timestamp)
    status_code: Mapped[int | None] = mapped_column(Integer)
    latency_ms: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
