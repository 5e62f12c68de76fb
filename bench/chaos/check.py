"""The chaos run's checker: the whole history (what each client was told, the receiver's
deliveries, the faults) against Postgres at the end.

What it counts; each but the last fails the run (exit status 1) when it is not zero:
- **lost**: a job or batch a client was told was accepted (2xx) that is not in Postgres,
  or any job or batch that never ended;
- **done twice**: an online answer the client got that is not the result stored for its
  job (a job run twice, the client told one run and the store keeping another), or a
  batch line twice in its output and error files;
- **duplicate idempotent jobs**: one `Idempotency-Key` that made two jobs, or was told
  two ids;
- **counter disagreements**: a batch whose `request_counts` differ from its lines;
- **undelivered webhooks**: an ended job or batch with a webhook whose event the receiver
  never accepted, or a delivery given up on; and **webhooks with two ids**: one event
  delivered under two `webhook-id`s;
- **waited past the bound**: a single job that waited to start longer than the bound
  after a `cancel_consumers` or `thread_death` fault, and **unhealed**: a process that
  said it was stuck after one and never took work again (bench/chaos/waits.py: the
  bound, and how a wait is put down to a fault);
- streams that ended without `[DONE]` or an error event (reported only: an API killed
  under a stream cuts it).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import psycopg

from bench.chaos.cluster import ADMIN_KEY
from bench.chaos.load import History
from bench.chaos.receiver import Delivery
from bench.chaos.waits import waits_after_faults
from inferq.domain.jobs import Job
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore

FAILING = (
    "lost",
    "done_twice",
    "duplicate_idempotent_jobs",
    "counter_disagreements",
    "undelivered_webhooks",
    "webhooks_with_two_ids",
    "waited_past_bound",
    "unhealed",
)
ACCEPTED = (200, 201, 202)


def check(
    *,
    history: History,
    deliveries: Sequence[Delivery],
    faults: Sequence[dict[str, Any]],
    logs: Path,
    database_url: str,
    api_url: str,
) -> dict[str, Any]:
    """Every finding, with a few examples of each."""
    dsn = database_url.replace("+psycopg", "")
    with psycopg.connect(dsn) as conn:
        statuses: dict[str, int] = dict(
            conn.execute("SELECT status, count(*) FROM jobs GROUP BY status").fetchall()
        )
        unended_jobs = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM jobs WHERE status IN ('queued', 'running') LIMIT 20"
            )
        ]
        batches = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT id, status, request_total, request_completed, request_failed, "
                "output_file_id, error_file_id FROM batches"
            )
        }
        lines = {
            row[0]: row[1:]
            for row in conn.execute(
                "SELECT batch_id, count(*), count(*) FILTER (WHERE status = 'succeeded'), "
                "count(*) FILTER (WHERE status IN ('failed', 'cancelled')) FROM jobs "
                "WHERE batch_id IS NOT NULL GROUP BY batch_id"
            )
        }
        keyed: dict[str, int] = {
            row[0]: row[1]
            for row in conn.execute(
                "SELECT metadata->>'chaos_key', count(*) FROM jobs "
                "WHERE metadata ? 'chaos_key' GROUP BY 1"
            )
        }
        given_up = [
            r[0]
            for r in conn.execute(
                "SELECT id FROM webhook_deliveries WHERE state IN ('dead', 'disabled')"
            )
        ]
        pending_webhooks = conn.execute(
            "SELECT count(*) FROM webhook_deliveries WHERE state IN ('pending', 'delivering')"
        ).fetchone()
    engine = make_database(database_url, pool_size=1)
    store = JobStore(make_sessions(engine))
    try:
        found = _findings(
            history=history,
            deliveries=deliveries,
            store=store,
            batches=batches,
            lines=lines,
            keyed=keyed,
            api_url=api_url,
        )
    finally:
        engine.dispose()
    found["lost"] += [f"job {j} never ended" for j in unended_jobs]
    found["lost"] += [
        f"batch {b} is {row[0]}" for b, row in batches.items() if row[0] not in _BATCH_ENDED
    ]
    found["undelivered_webhooks"] += [f"delivery {d} given up" for d in given_up]
    bound = waits_after_faults(faults=faults, database_url=database_url, logs=logs)
    for name, items in bound.pop("findings").items():
        found[name] += items
    report: dict[str, Any] = {
        "jobs": dict(statuses),
        "batches": len(batches),
        "webhook_deliveries_pending": pending_webhooks[0] if pending_webhooks else 0,
        "counts": {name: len(items) for name, items in found.items()},
        "examples": {name: items[:5] for name, items in found.items() if items},
        "client": _client_counts(history),
        "bound": bound,
    }
    report["failed"] = any(report["counts"].get(name) for name in FAILING)
    return report


_BATCH_ENDED = {"completed", "failed", "expired", "cancelled"}


def _findings(
    *,
    history: History,
    deliveries: Sequence[Delivery],
    store: JobStore,
    batches: dict[str, tuple[Any, ...]],
    lines: dict[str, tuple[Any, ...]],
    keyed: dict[str, int],
    api_url: str,
) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    told = [r for r in history.of("job") + history.of("poison") if r["status"] in ACCEPTED]
    jobs = _jobs(store, [r["job_id"] for r in told])
    for record in told:
        if record["job_id"] not in jobs:
            found["lost"].append(f"job {record['job_id']} was accepted and is not stored")
    _idempotency(history, keyed, found)
    _online(history, store, found)
    _batches(history, batches, lines, api_url, found)
    _webhooks(history, deliveries, jobs, batches, found)
    for record in history.of("stream"):
        if record["status"] == 200 and record["ending"] == "cut":
            found["streams_cut"].append(f"stream of {record['job_id']} ended without [DONE]")
    for name in FAILING:
        found.setdefault(name, [])
    return found


def _batches(
    history: History,
    batches: dict[str, tuple[Any, ...]],
    lines: dict[str, tuple[Any, ...]],
    api_url: str,
    found: dict[str, list[str]],
) -> None:
    for record in history.of("batch"):
        batch_id = record["batch_id"]
        if record["status"] == 200 and batch_id not in batches:
            found["lost"].append(f"batch {batch_id} was accepted and is not stored")
    for batch_id, (status, total, completed, failed, output_id, error_id) in batches.items():
        counted = lines.get(batch_id, (0, 0, 0))
        if (total, completed, failed) != counted and status in _BATCH_ENDED | {"in_progress"}:
            found["counter_disagreements"].append(
                f"batch {batch_id} {status}: counts {(total, completed, failed)}, lines {counted}"
            )
        if status in _BATCH_ENDED:
            found["done_twice"] += _twice_in_files(api_url, batch_id, output_id, error_id)


def _jobs(store: JobStore, job_ids: Sequence[str]) -> dict[str, Job]:
    found: dict[str, Job] = {}
    ids = [j for j in job_ids if j]
    for start in range(0, len(ids), 500):
        found.update({job.id: job for job in store.get_jobs(ids[start : start + 500])})
    return found


def _idempotency(history: History, keyed: dict[str, int], found: dict[str, list[str]]) -> None:
    told: defaultdict[str, set[str]] = defaultdict(set)
    for record in history.of("job"):
        if record["key"] and record["job_id"]:
            told[record["key"]].add(record["job_id"])
    for key, ids in told.items():
        if len(ids) > 1:
            found["duplicate_idempotent_jobs"].append(f"key {key} was told {sorted(ids)}")
    for key, count in keyed.items():
        if count > 1:
            found["duplicate_idempotent_jobs"].append(f"key {key} made {count} jobs")


def _online(history: History, store: JobStore, found: dict[str, list[str]]) -> None:
    """An answer a client got must be the result stored for its job."""
    answered = [r for r in history.of("chat") if r["job_id"]]
    answered += [r for r in history.of("stream") if r["job_id"] and r["ending"] == "done"]
    jobs = _jobs(store, [r["job_id"] for r in answered])
    for record in answered:
        job = jobs.get(record["job_id"])
        if job is None:
            found["lost"].append(f"online job {record['job_id']} answered and not stored")
        elif job.result is None or job.result.choices[0].text != record["text"]:
            stored = None if job.result is None else job.result.choices[0].text
            found["done_twice"].append(
                f"job {job.id} ({job.status}): told {record['text']!r}, stored {stored!r}"
            )


def _twice_in_files(
    api_url: str, batch_id: str, output_id: str | None, error_id: str | None
) -> list[str]:
    seen: defaultdict[str, int] = defaultdict(int)
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    for file_id in (output_id, error_id):
        if file_id is None:
            continue
        response = httpx.get(f"{api_url}/v1/files/{file_id}/content", headers=headers, timeout=60)
        response.raise_for_status()
        for line in response.text.splitlines():
            seen[json.loads(line)["custom_id"]] += 1
    return [f"batch {batch_id}: line {cid} written {n} times" for cid, n in seen.items() if n > 1]


def _webhooks(
    history: History,
    deliveries: Sequence[Delivery],
    jobs: dict[str, Job],
    batches: dict[str, tuple[Any, ...]],
    found: dict[str, list[str]],
) -> None:
    ids: defaultdict[tuple[str, str], set[str]] = defaultdict(set)
    for delivery in deliveries:
        ids[(delivery.event, delivery.object_id)].add(delivery.webhook_id)
    accepted = {(d.event, d.object_id) for d in deliveries if d.accepted}
    for (event, object_id), webhook_ids in ids.items():
        if len(webhook_ids) > 1:
            found["webhooks_with_two_ids"].append(f"{event} of {object_id}: {sorted(webhook_ids)}")
    expected = []
    for record in history.of("job"):
        job = jobs.get(record["job_id"] or "")
        if record["webhook"] and job is not None and job.status.is_terminal:
            expected.append((f"job.{job.status.value}", job.id))
    for record in history.of("batch"):
        batch = batches.get(record["batch_id"] or "")
        if record.get("webhook") and batch is not None and batch[0] in _BATCH_ENDED:
            expected.append((f"batch.{batch[0]}", record["batch_id"]))
    found["undelivered_webhooks"] += [f"{e} of {o}" for e, o in expected if (e, o) not in accepted]


def _client_counts(history: History) -> dict[str, Any]:
    counts: dict[str, Any] = {}
    for kind in ("job", "poison", "chat", "batch", "cancel"):
        records = history.of(kind)
        counts[kind] = {
            "sent": len(records),
            "accepted": sum(1 for r in records if r["status"] in ACCEPTED),
            "unanswered": sum(1 for r in records if r["status"] is None),
            "retried": sum(1 for r in records if (r.get("tries") or 1) > 1),
        }
    streams = history.of("stream")
    counts["stream"] = {
        ending: sum(1 for r in streams if r["ending"] == ending)
        for ending in ("done", "error", "cut", "timeout", "refused")
    }
    return counts
