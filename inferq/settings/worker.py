"""The GPU worker's settings: admission, leases, draining, results and its metrics."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WorkerSettings(BaseModel):
    """How a GPU worker takes jobs into its engine, holds them, and gives them back."""

    # Admission: how queued jobs enter the engine.
    max_batch_size: int = Field(
        64,
        ge=1,
        description="The micro-batch: how many batch lines an idle engine waits "
        "(max_batch_delay_ms at most) to start together, and how many a worker claims at "
        "a time; it holds up to two beyond a full engine, ready for the room its steps free.",
    )
    max_batch_delay_ms: int = Field(
        5, ge=0, description="How long an idle engine waits to fill a micro-batch."
    )

    worker_concurrency: int | None = Field(
        None,
        ge=1,
        description="Messages a GPU worker takes at once; max_num_seqs + interactive_seqs + "
        "max_batch_size if unset.",
    )
    bulk_chunk_size: int | None = Field(
        None,
        ge=1,
        description="Batch lines a batch's wake-up message names, for Flower (the feeder "
        "claims lines from Postgres); max_batch_size if unset.",
    )
    lease_s: int = Field(
        60, ge=3, description="A running job's lease; its worker renews it while alive."
    )
    requeue_after_s: int = Field(
        6 * 3600,
        ge=60,
        description="A queued job not taken for this long is published again (lost message).",
    )
    drain_timeout_s: float = Field(
        60, ge=0, description="On SIGTERM, how long a worker lets in-flight jobs finish."
    )
    result_flush_ms: int = Field(
        20,
        ge=0,
        description="Least time between two flushes of results (a single job's result "
        "after a quiet spell is written at once; batch lines wait up to 1 s for company "
        "while more are on their way).",
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

    @property
    def effective_bulk_chunk_size(self) -> int:
        # A message is a micro-batch: the worker's door holds a full engine plus one.
        return self.bulk_chunk_size or self.max_batch_size
