"""The job store: every SQL statement about jobs lives here or in the two halves it is
built of, `inferq.store.job_leases` (the GPU worker's) and `inferq.store.job_publishing`
(maintenance's)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Table, insert, inspect, select, text
from sqlalchemy.orm import Session

from inferq.domain.jobs import Job, JobSpec, JobStatus
from inferq.domain.webhooks import WebhookRequest
from inferq.exceptions import InferqError, InvalidState
from inferq.store.base import Page, newest_first, scoped_row
from inferq.store.batch_claims import BatchClaims
from inferq.store.batch_counts import EndedLine, count_ended, lock_batches_of
from inferq.store.bulk import copy_rows
from inferq.store.idempotency import IdempotentRequest, record_response
from inferq.store.job_publishing import JobPublishing
from inferq.store.job_rows import (
    ACTIVE,
    ACTIVE_AMONG,
    JOBS_BY_ID,
    job_from_row,
    new_job,
    new_job_row,
)
from inferq.store.models import JobRow
from inferq.store.outbox import enqueue_job_events, ensure_endpoint
from inferq.store.usage import Demand, refuse_over_quota

# Built once, on the table rather than the ORM class: the ORM's bulk insert sorts and
# checks every row's attributes, which cost a single job's submission more CPU than the
# round trip. Its rows are keyed by column (`metadata`, not the attribute `metadata_`),
# and the rows of one execution must name the same columns.
_INSERT_JOBS = insert(cast(Table, JobRow.__table__))
_COLUMN_OF = {attribute.key: attribute.columns[0].key for attribute in inspect(JobRow).column_attrs}


def _insert_jobs(connection: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert job rows (ORM attribute names as keys), those with a webhook apart: a column
    a row leaves out is NULL, which a JSON column given None would not be."""
    by_columns: dict[frozenset[str], list[dict[str, Any]]] = {}
    for row in rows:
        by_columns.setdefault(frozenset(row), []).append(
            {_COLUMN_OF[key]: value for key, value in row.items()}
        )
    for group in by_columns.values():
        connection.execute(_INSERT_JOBS, group)


def _same_columns(rows: Sequence[dict[str, Any]]) -> bool:
    return len({frozenset(row) for row in rows}) == 1


@dataclass(frozen=True, kw_only=True)
class NewJob:
    """A job to write: what it asks for, whose it is, and what to do when it ends."""

    spec: JobSpec
    tenant: str
    # The API key that submits it (None: none, as in `inferq run`), and whether that key
    # has a quota to check.
    key_id: str | None = None
    quota: bool = False
    webhook: WebhookRequest | None = None
    # The idempotency key it was submitted under, whose response is remembered with it.
    idempotency: IdempotentRequest | None = None
    # Its id, when its submitter chose it (`new_job_id()`) to wait on the job before it
    # is written; else a new one.
    id: str | None = None

    @property
    def quota_checked(self) -> bool:
        """Whether its key's quota is checked when it is written."""
        return self.quota and self.key_id is not None

    @property
    def alone(self) -> bool:
        """Whether it is written without anything else: no quota to check, no webhook
        endpoint or idempotent response to write with it."""
        return not self.quota_checked and self.webhook is None and self.idempotency is None


def _over_quota(
    session: Session, new_jobs: Sequence[NewJob], rows: Sequence[dict[str, Any]], *, now: datetime
) -> list[InferqError | None]:
    """Why each job's key's quota refuses it (None where it fits, or its key has none)."""
    checked = [i for i, new in enumerate(new_jobs) if new.quota_checked]
    refused: list[InferqError | None] = [None] * len(new_jobs)
    if checked:
        demands = [Demand(str(new_jobs[i].key_id), rows[i]["cost_tokens"]) for i in checked]
        for i, refusal in zip(checked, refuse_over_quota(session, demands, now=now), strict=True):
            refused[i] = refusal
    return refused


class JobStore(BatchClaims, JobPublishing):
    """Reads and writes jobs: submitted, read and cancelled here; claimed, renewed and
    finished by GPU workers (`JobLeases`, and `BatchClaims` for batch lines); published
    again by maintenance (`JobPublishing`)."""

    def ping(self) -> None:
        with self._transaction() as session:
            session.execute(text("SELECT 1"))

    def submit_jobs(
        self,
        new_jobs: Sequence[NewJob],
        *,
        queue: str | Callable[[JobSpec], str],
        requeue_after_s: int,
        respond: Callable[[Job], dict[str, Any]] | None = None,
    ) -> list[Job | InferqError]:
        """Write new queued jobs, each for its own tenant, in one transaction; return each
        one's job, or why its key's quota refused it (checked in the same transaction, for
        jobs whose key has one). `queue` names each one's queue, or is a function of its
        spec that does.

        A job submitted under an idempotency key has its response (`respond(job)`, the
        body of a 202) remembered in the same transaction, so both are written or neither.
        """
        now = self._clock()
        rows = [
            new_job_row(
                new.spec,
                tenant=new.tenant,
                queue=queue if isinstance(queue, str) else queue(new.spec),
                now=now,
                requeue_after_s=requeue_after_s,
                key_id=new.key_id,
                job_id=new.id,
            )
            for new in new_jobs
        ]
        jobs = [new_job(row, new.spec) for row, new in zip(rows, new_jobs, strict=True)]
        # Nothing to check or write with them: one command, which commits on its own, all
        # of them or none. Several by COPY on the driver's connection: at 3 jobs, half the
        # CPU of SQLAlchemy's insert in an ORM session's transaction.
        alone = all(new.alone for new in new_jobs)
        if alone and len(rows) == 1:
            with self._statement() as connection:
                _insert_jobs(connection, rows)
            return list(jobs)
        if alone and self._postgres and _same_columns(rows):
            with self._driver() as driver:
                copy_rows(driver, JobRow, rows)
            return list(jobs)
        with self._transaction() as session:
            refused = _over_quota(session, new_jobs, rows, now=now)
            taken = [i for i in range(len(new_jobs)) if refused[i] is None]
            endpoints: dict[tuple[str, str], str] = {}
            for i in taken:
                row, new = rows[i], new_jobs[i]
                if new.webhook is None:
                    continue
                target = (new.tenant, new.webhook.url)
                if target not in endpoints:
                    endpoints[target] = ensure_endpoint(
                        session, tenant=new.tenant, url=new.webhook.url, now=now
                    )
                row["webhook_endpoint_id"] = endpoints[target]
                row["webhook_events"] = new.webhook.events
            if taken:
                _insert_jobs(session.connection(), [rows[i] for i in taken])
            for i in taken:
                idempotency = new_jobs[i].idempotency
                if idempotency is not None:
                    assert respond is not None, "an idempotent submission needs `respond`"
                    record_response(session, idempotency, status_code=202, body=respond(jobs[i]))
        return [refusal or job for refusal, job in zip(refused, jobs, strict=True)]

    def get_job(self, job_id: str, *, scope: str | None = None) -> Job:
        """The job, if it exists and belongs to `scope` (a tenant; None sees every tenant)."""
        with self._transaction() as session:
            return job_from_row(scoped_row(session, JobRow, job_id, scope, noun="job"))

    def ended_among(self, job_ids: Sequence[str]) -> set[str]:
        """Which of these jobs are no longer queued or running (or no longer exist)."""
        with self._statement() as connection:
            active = set(connection.scalars(ACTIVE_AMONG, {"ids": list(job_ids)}))
        return set(job_ids) - active

    def get_jobs(self, job_ids: Sequence[str]) -> list[Job]:
        with self._statement() as connection:
            rows = connection.execute(JOBS_BY_ID, {"ids": list(job_ids)})
            return [job_from_row(row) for row in rows]

    def list_jobs(
        self,
        *,
        scope: str | None = None,
        status: JobStatus | None = None,
        batch_id: str | None = None,
        after: str | None = None,
        limit: int = 20,
    ) -> Page[Job]:
        """Jobs newest first; `after` is the id of the last job of the previous page."""
        query = select(JobRow)
        if batch_id is not None:
            query = query.where(JobRow.batch_id == batch_id)
        if scope is not None:
            query = query.where(JobRow.tenant == scope)
        if status is not None:
            query = query.where(JobRow.status == status.value)
        with self._transaction() as session:
            return newest_first(
                session,
                query,
                JobRow.id,
                after=after,
                limit=limit,
                convert=lambda rows: [job_from_row(row) for row in rows],
            )

    def cancel_job(self, job_id: str, *, scope: str | None = None) -> Job:
        """Cancel a queued or running job; a finished one raises `InvalidState`."""
        with self._transaction() as session:
            lock_batches_of(session, [job_id])
            row = scoped_row(session, JobRow, job_id, scope, noun="job", for_update=True)
            if row.status not in ACTIVE:
                raise InvalidState(
                    f"job {job_id} is already {row.status}: only queued or running jobs "
                    "can be cancelled"
                )
            row.status = JobStatus.CANCELLED.value
            row.finished_at = self._clock()
            row.lease_expires_at = None
            if row.batch_id is not None:
                count_ended(session, [EndedLine(row.batch_id, row.status, 0, None)])
            queued = enqueue_job_events(session, [row], row.finished_at)
            job = job_from_row(row)
        self._wake_delivery(queued)
        return job
