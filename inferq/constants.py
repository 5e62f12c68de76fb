"""Names shared across processes: queues, tasks, Redis keys, headers, id prefixes."""

from typing import Final

# Celery queues. Single jobs and batch-file lines travel apart so bulk work never
# sits in front of a single job in Redis; each served model has its own pair
# (inferq/domain/queue_names.py names them).
INTERACTIVE_QUEUE: Final = "interactive"
BULK_QUEUE: Final = "bulk"
# Work that needs no GPU, on the housekeeper, so it never waits behind generation.
MAINTENANCE_QUEUE: Final = "maintenance"
WEBHOOKS_QUEUE: Final = "webhooks"
SERVICE_QUEUES: Final = (MAINTENANCE_QUEUE, WEBHOOKS_QUEUE)

# Celery task names: the API publishes by name and never imports the worker.
RUN_JOBS_TASK: Final = "inferq.run_jobs"
MAINTAIN_TASK: Final = "inferq.maintain"
FINALIZE_BATCH_TASK: Final = "inferq.finalize_batch"
DELIVER_WEBHOOKS_TASK: Final = "inferq.deliver_webhooks"

# Redis keys and channels, each under `Settings.redis_key_prefix`.
JOBS_DONE_CHANNEL: Final = "jobs:done"
JOBS_CANCEL_CHANNEL: Final = "jobs:cancel"
# A queue's batch lines were queued: every worker of the queue looks for them at once.
LINES_QUEUED_CHANNEL: Final = "lines:queued"
# A batch's lines have ended (some of them): wakes whoever follows its output.
BATCH_PROGRESS_CHANNEL: Final = "batches:progress"
# A streamed job's tokens, as generated: a Redis Stream per job (inferq/broker/token_stream.py).
TOKENS_STREAM: Final = "tokens"
# Each API process subscribes to a channel of its own (a name plus a random suffix).
API_CHANNEL: Final = "api"
# Set once by maintenance; if it is gone, Redis lost its data and every queued job is
# published again from Postgres.
EPOCH_KEY: Final = "epoch"
MAINTENANCE_LOCK_KEY: Final = "maintenance:lock"
MAINTENANCE_LAST_RUN_KEY: Final = "maintenance:last-run"
# Per served model, how many jobs maintenance last found stuck (queued for
# INFERQ_STALL_S while workers for the model had room): JSON, gone if maintenance stops.
# The key keeps its name, as the metric `inferq_jobs_stalled` does.
JOBS_STUCK_KEY: Final = "jobs:stalled"
# Reports of retention's latest passes (JSON, newest first), and how many are kept.
RETENTION_PASSES_KEY: Final = "retention:passes"
RETENTION_PASSES_KEPT: Final = 1000

# HTTP headers.
IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"
IDEMPOTENT_REPLAY_HEADER: Final = "Idempotent-Replayed"
# On online completions: the job that answers the request (see it at /v1/jobs/{id}).
JOB_ID_HEADER: Final = "Inferq-Job-Id"
# Where Anthropic's clients send an API key (`Authorization: Bearer` works too).
API_KEY_HEADER: Final = "x-api-key"

# Id prefixes, so an id says what it names.
JOB_ID_PREFIX: Final = "job_"

# Headers of `GET /v1/batches/{id}/output`: where to go on from, and whether every line ended.
NEXT_CURSOR_HEADER: Final = "Inferq-Next-Cursor"
BATCH_ENDED_HEADER: Final = "Inferq-Batch-Ended"
