"""The flush: results written, each only if its job is still queued or running, with the
jobs' usage, their batches' counts and the webhook deliveries they asked for, all or
nothing. One variant per dialect, side by side; the store picks one
(`inferq/store/dialects.py`). On PostgreSQL one statement, in one round trip on psycopg's
own connection, with no transaction around it (it commits on its own): a flush is the
worker's costliest call per single job. On SQLite (`inferq run`: one writer at a time, so
nothing to lock) the same steps, one statement at a time, in the caller's transaction.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg import sql
from sqlalchemy import bindparam, select, update
from sqlalchemy.orm import Session

from inferq.domain.jobs import JobOutcome, JobStatus
from inferq.domain.usage import hour_of
from inferq.domain.webhooks import DeliveryState
from inferq.ids import new_id
from inferq.store import text_codec
from inferq.store.batch_counts import count_finished
from inferq.store.job_rows import ACTIVE, outcome_values
from inferq.store.models import BatchRow, JobRow, UsageRow, WebhookDeliveryRow
from inferq.store.outbox import DELIVERY_ID_PREFIX, EndedJob, enqueue_job_events
from inferq.store.usage import add_usage, ended_usage


class Flushed(NamedTuple):
    """What a flush wrote: the ids of the jobs it ended, and how many webhook deliveries
    it queued."""

    written: set[str]
    queued: int


def flush_on_postgres(
    driver: psycopg.Connection[Any], outcomes: Sequence[JobOutcome], now: datetime
) -> Flushed:
    """End the jobs of `outcomes` that are still queued or running, in one statement on
    psycopg's connection `driver` (which commits on its own)."""
    values = []
    for outcome in outcomes:
        result, error = outcome.result, outcome.error
        value: dict[str, Any] = {
            "id": outcome.job_id,
            "status": outcome.status.value,
            "started_at": outcome.started_at,
            "delivery_id": new_id(DELIVERY_ID_PREFIX),
        }
        if result is not None:
            value["choices"] = [choice.to_dict() for choice in result.choices]
            value["completion_tokens"] = result.completion_tokens
            if result.embedding is not None:
                value["embedding"] = base64.b64encode(result.embedding).decode()
        if error is not None:
            value["error"] = error.to_dict()
        values.append(value)
    rows = driver.execute(
        _statement(),
        {
            # One JSON document, where arrays of each value cost psycopg more to send.
            "values": text_codec.dumps(values),
            "ids": [outcome.job_id for outcome in outcomes],
            "active": list(ACTIVE),
            "now": now,
            "hour": hour_of(now),
            "succeeded": JobStatus.SUCCEEDED.value,
            "pending": DeliveryState.PENDING.value,
        },
    ).fetchall()
    # Each row: a job ended, its batch, and whether a delivery was queued for it.
    return Flushed({job_id for job_id, _, _ in rows}, sum(queued for _, _, queued in rows))


def flush_on_sqlite(session: Session, outcomes: Sequence[JobOutcome], now: datetime) -> Flushed:
    """End the jobs of `outcomes` that are still queued or running, in `session`'s
    transaction: their rows are read first, with what the other steps need of them."""
    ended_values = {o.job_id: outcome_values(o, now) for o in outcomes}
    rows = session.connection().execute(_FINISHING, {"ids": list(ended_values)}).all()
    if rows:
        session.execute(update(JobRow), [ended_values[row.id] for row in rows])
    values = {row.id: ended_values[row.id] for row in rows}
    count_finished(session, rows, values)
    add_usage(session, ended_usage(rows, values, now))
    queued = enqueue_job_events(
        session,
        [
            EndedJob(row.id, row.tenant, values[row.id]["status"], *row[2:4])
            for row in rows
            if row.webhook_endpoint_id is not None
        ],
        now,
    )
    return Flushed(set(values), queued)


# The rows a flush on SQLite ends, with what it needs of them (whose they are, their
# webhooks, batches and prompt sizes).
_FINISHING = select(
    JobRow.id,
    JobRow.tenant,
    JobRow.webhook_endpoint_id,
    JobRow.webhook_events,
    JobRow.batch_id,
    JobRow.prompt_tokens,
    JobRow.key_id,
    JobRow.model,
).where(JobRow.id.in_(bindparam("ids", expanding=True)), JobRow.status.in_(ACTIVE))


# The flush on PostgreSQL. The values each outcome brings, and their types in Postgres
# (an embedding comes in base64). A value an outcome leaves out (a failure has no choices,
# a result no error) leaves the job's as it is.
_VALUES = {
    "id": "varchar",
    "status": "varchar",
    "started_at": "timestamptz",
    "choices": "jsonb",
    "completion_tokens": "integer",
    "embedding": "text",
    "error": "jsonb",
    "delivery_id": "varchar",
}

_KEPT_UNLESS_GIVEN = ("started_at", "choices", "completion_tokens", "embedding", "error")

_USAGE_COUNTS = ("input_tokens", "output_tokens", "embedding_tokens", "jobs", "batch_lines")

_BATCH_COUNTS = ("request_completed", "request_failed", "input_tokens", "output_tokens")

_STATEMENT = """
WITH v AS (
    SELECT * FROM jsonb_to_recordset(%(values)s::jsonb) AS v({columns})
),
ended AS (
    UPDATE {jobs} AS t
    SET status = v.status, finished_at = %(now)s, lease_expires_at = NULL, {kept}
    FROM v
    -- The jobs are found by id, and their statuses checked against a parameter: with
    -- the statuses written in, the planner may read every active job through a partial
    -- index of them instead (all those in flight and queued, at every flush).
    WHERE t.id = v.id AND t.id = ANY(%(ids)s) AND t.status = ANY(%(active)s)
        -- The rows of the jobs' batches are locked first, in id order (the lock order of
        -- inferq/store/batch_counts.py): a sub-select that refers to nothing outside it
        -- runs once, before any job row is read ("InitPlan" in EXPLAIN).
        AND (SELECT count(*) FROM (
            SELECT b.id FROM {batches} AS b
            WHERE b.id IN (SELECT j.batch_id FROM {jobs} AS j WHERE j.id = ANY(%(ids)s))
            ORDER BY b.id FOR UPDATE OF b
        ) AS locked) >= 0
    RETURNING t.id, t.tenant, t.key_id, t.model, t.batch_id, t.prompt_tokens,
        t.webhook_endpoint_id, t.webhook_events, v.status, v.delivery_id,
        v.status = %(succeeded)s AND v.embedding IS NULL AS generated,
        v.status = %(succeeded)s AND v.embedding IS NOT NULL AS embedded,
        coalesce(v.completion_tokens, 0) AS output_tokens
),
used AS (
    INSERT INTO {usage} AS u (tenant, key_id, model, hour, {usage_counts})
    SELECT tenant, coalesce(key_id, ''), model, %(hour)s,
        coalesce(sum(prompt_tokens) FILTER (WHERE generated), 0),
        coalesce(sum(output_tokens) FILTER (WHERE generated), 0),
        coalesce(sum(prompt_tokens) FILTER (WHERE embedded), 0),
        count(*) FILTER (WHERE batch_id IS NULL),
        count(*) FILTER (WHERE batch_id IS NOT NULL)
    FROM ended
    GROUP BY 1, 2, 3
    -- Rows locked in key order, as every writer of usage does (inferq/store/usage.py).
    ORDER BY 1, 2, 3
    ON CONFLICT (tenant, key_id, model, hour) DO UPDATE SET {usage_sums}
),
counted AS (
    UPDATE {batches} AS b SET {batch_sums}
    FROM (
        SELECT batch_id,
            count(*) FILTER (WHERE status = %(succeeded)s) AS request_completed,
            count(*) FILTER (WHERE status <> %(succeeded)s) AS request_failed,
            coalesce(sum(prompt_tokens) FILTER (WHERE status = %(succeeded)s), 0)
                AS input_tokens,
            coalesce(sum(output_tokens) FILTER (WHERE status = %(succeeded)s), 0)
                AS output_tokens
        FROM ended WHERE batch_id IS NOT NULL GROUP BY batch_id
    ) AS c
    WHERE b.id = c.batch_id
),
queued AS (
    INSERT INTO {deliveries}
        (id, tenant, endpoint_id, event, job_id, state, attempts, next_attempt_at, created_at)
    SELECT delivery_id, tenant, webhook_endpoint_id, 'job.' || status, id, %(pending)s, 0,
        %(now)s, %(now)s
    FROM ended
    -- inferq.domain.webhooks.wants: no list of events (SQL or JSON null), or one that
    -- names this event.
    WHERE webhook_endpoint_id IS NOT NULL AND (
        webhook_events IS NULL OR jsonb_typeof(webhook_events) = 'null'
        OR webhook_events ? ('job.' || status)
    )
    RETURNING job_id
)
SELECT e.id, e.batch_id, q.job_id IS NOT NULL FROM ended AS e LEFT JOIN queued AS q
    ON q.job_id = e.id
"""


@functools.cache
def _statement() -> str:
    """The flush's text, composed once, without its comments and indentation: psycopg
    parses a text statement of at most 4 KiB once (a longer one, or a composed one, at
    every execution)."""
    bare = " ".join(re.sub(r"--[^\n]*", "", _STATEMENT).split())
    return (
        sql.SQL(bare)
        .format(
            columns=sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind))
                for name, kind in _VALUES.items()
            ),
            kept=sql.SQL(", ").join(
                sql.SQL("{name} = coalesce({given}, t.{name})").format(
                    name=sql.Identifier(name),
                    given=sql.SQL("decode(v.embedding, 'base64')")
                    if name == "embedding"
                    else sql.SQL("v.{}").format(sql.Identifier(name)),
                )
                for name in _KEPT_UNLESS_GIVEN
            ),
            jobs=sql.Identifier(JobRow.__tablename__),
            batches=sql.Identifier(BatchRow.__tablename__),
            usage=sql.Identifier(UsageRow.__tablename__),
            deliveries=sql.Identifier(WebhookDeliveryRow.__tablename__),
            usage_counts=sql.SQL(", ").join(map(sql.Identifier, _USAGE_COUNTS)),
            usage_sums=_sums("u", "EXCLUDED", _USAGE_COUNTS),
            batch_sums=_sums("b", "c", _BATCH_COUNTS),
        )
        .as_string(None)
    )


def _sums(target: str, added: str, names: Sequence[str]) -> sql.Composable:
    """`name = target.name + added.name`, for each of `names`."""
    return sql.SQL(", ").join(
        sql.SQL("{name} = {target}.{name} + {added}.{name}").format(
            name=sql.Identifier(name), target=sql.SQL(target), added=sql.SQL(added)
        )
        for name in names
    )
