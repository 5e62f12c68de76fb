"""Retention and batch counters on real Postgres (and SQLite, for `inferq run`), with a
clock the tests move: what goes when, what stays, and that nothing is half-visible."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import Connection, create_engine, func, insert, select, text
from sqlalchemy.orm import Session, sessionmaker

from housekeeper.retention import CHUNK_ROWS, Retention
from inferq.domain.batches import FilePurpose
from inferq.domain.jobs import JobError, JobOutcome
from inferq.domain.usage import Usage
from inferq.exceptions import NotFound
from inferq.store.batch_rows import NewBatch
from inferq.store.batches import BatchStore
from inferq.store.database import make_database, make_sessions
from inferq.store.files import FileSize, FileStore
from inferq.store.idempotency import IdempotencyStore, IdempotentRequest
from inferq.store.jobs import JobStore
from inferq.store.migrate import alembic_config, upgrade
from inferq.store.models import (
    BatchRow,
    FileChunkRow,
    FileRow,
    IdempotencyKeyRow,
    JobRow,
    WebhookAttemptRow,
    WebhookDeliveryRow,
    WebhookEndpointRow,
)
from inferq.store.retention import RetentionStore
from inferq.store.usage import UsageStore
from inferq.wire.batch_lines import LineSpec
from tests.helpers.clock import Clock
from tests.helpers.jobs import create_jobs, job_result, job_spec

DAY = 86400


@dataclass
class Stores:
    sessions: sessionmaker[Session]
    clock: Clock
    jobs: JobStore
    batches: BatchStore
    files: FileStore
    idempotency: IdempotencyStore

    def retention(self, *, job_s: int = DAY, webhook_s: int = DAY) -> Retention:
        return Retention(
            RetentionStore(self.sessions, clock=self.clock),
            job_retention_s=job_s,
            webhook_retention_s=webhook_s,
            clock=self.clock,
        )

    def count(self, row: type, *where: object) -> int:
        with self.sessions() as session:
            return int(session.scalar(select(func.count()).select_from(row).where(*where)) or 0)


@pytest.fixture(params=["postgres", "sqlite"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    if request.param == "postgres":
        url = str(request.getfixturevalue("database_url"))
    else:
        url = f"sqlite:///{tmp_path / 'store.db'}"
        upgrade(url)
    with _stores_on(url) as stores:
        yield stores


@pytest.fixture
def postgres_stores(database_url: str) -> Iterator[Stores]:
    with _stores_on(database_url) as stores:
        yield stores


@contextmanager
def _stores_on(url: str) -> Iterator[Stores]:
    engine = make_database(url, pool_size=2)
    sessions = make_sessions(engine)
    clock = Clock()
    yield Stores(
        sessions=sessions,
        clock=clock,
        jobs=JobStore(sessions, clock=clock),
        batches=BatchStore(sessions, clock=clock),
        files=FileStore(sessions, clock=clock),
        idempotency=IdempotencyStore(sessions, clock=clock),
    )
    engine.dispose()


def _finish(stores: Stores, job_ids: list[str]) -> None:
    stores.jobs.claim_jobs(job_ids, worker="w", lease_s=60)
    stores.jobs.finish_jobs([JobOutcome(job_id=j, result=job_result()) for j in job_ids])


def _upload(stores: Stores, *, expires_after_s: int | None, chunks: int = 1) -> str:
    return stores.files.upload(
        tenant="t",
        purpose=FilePurpose.BATCH,
        filename="in.jsonl",
        chunks=[b"x" * (1 << 20)] * (chunks - 1) + [b"{}\n"],
        max_bytes=1 << 30,
        expires_after_s=expires_after_s,
    ).id


def _batch(stores: Stores, lines: int, *, expires_after_s: int | None) -> tuple[str, list[str]]:
    """A batch in progress of `lines` lines; its id and its lines' job ids."""
    batch = stores.batches.create(
        NewBatch(
            tenant="t",
            endpoint="/v1/chat/completions",
            input_file_id=_upload(stores, expires_after_s=None),
            completion_window="24h",
            window=timedelta(hours=24),
            model="tiny",
            output_expires_after_s=expires_after_s,
        ),
        (LineSpec(line=i, custom_id=f"req-{i}", spec=job_spec()) for i in range(lines)),
        requeue_after_s=60,
        max_errors=10,
    )
    with stores.sessions() as session:
        ids = session.scalars(
            select(JobRow.id).where(JobRow.batch_id == batch.id).order_by(JobRow.line)
        ).all()
    return batch.id, list(ids)


def test_single_jobs_go_after_the_retention_and_batch_lines_stay(stores: Stores) -> None:
    jobs = [j.id for j in create_jobs(stores.jobs, [job_spec()] * 3, queue="q")]
    _finish(stores, jobs[:2])
    batch_id, lines = _batch(stores, 2, expires_after_s=None)
    _finish(stores, lines)
    stores.clock.now += timedelta(seconds=DAY - 1)
    assert stores.retention().run_once().deleted == {}

    stores.clock.now += timedelta(seconds=2)
    report = stores.retention().run_once()
    assert report.deleted == {"jobs": 2}
    for job_id in jobs[:2]:
        with pytest.raises(NotFound):
            stores.jobs.get_job(job_id)
    # The unfinished job stays however old; a batch's lines follow their batch (kept here).
    assert stores.jobs.get_job(jobs[2]).id == jobs[2]
    assert stores.batches.get(batch_id).counts.completed == 2
    # A retention of 0 keeps everything.
    _finish(stores, jobs[2:])
    stores.clock.now += timedelta(days=365)
    assert stores.retention(job_s=0).run_once().deleted == {}


def test_usage_adds_up_in_the_hour_jobs_end_and_retention_never_touches_it(
    stores: Stores,
) -> None:
    usage = UsageStore(stores.sessions, clock=stores.clock)
    first_hour = stores.clock.now
    jobs = [j.id for j in create_jobs(stores.jobs, [job_spec()] * 3, queue="q")]
    _finish(stores, jobs[:2])
    _, lines = _batch(stores, 4, expires_after_s=60)
    stores.clock.now += timedelta(hours=1)
    _finish(stores, jobs[2:] + lines)
    # Ended again (a redelivered result): not counted again.
    _finish(stores, jobs)

    def rows() -> dict[datetime, Usage]:
        found = usage.rows(start=first_hour, end=first_hour + timedelta(days=1))
        return {key.hour: value for key, value in found}

    counted = rows()
    assert counted == {
        first_hour: Usage(input_tokens=6, output_tokens=4, jobs=2, batches=1),
        first_hour + timedelta(hours=1): Usage(
            input_tokens=15, output_tokens=10, jobs=1, batch_lines=4
        ),
    }
    stores.clock.now += timedelta(days=30)
    assert stores.retention().run_once().deleted == {"jobs": 3}
    assert rows() == counted


def test_deletes_go_in_bounded_chunks_with_the_longest_reported(stores: Stores) -> None:
    count = CHUNK_ROWS * 2 + 10
    jobs = create_jobs(stores.jobs, [job_spec()] * count, queue="q")
    _finish(stores, [j.id for j in jobs])
    stores.clock.now += timedelta(days=2)
    report = stores.retention().run_once()
    assert report.deleted == {"jobs": count}
    # Three statements for the jobs (two full chunks, then the rest), one for each other kind.
    assert report.statements >= 3
    assert report.longest_statement_ms > 0
    assert not report.unfinished
    assert stores.count(JobRow) == 0


def test_an_expired_batch_output_answers_404_at_once_and_then_goes_whole(stores: Stores) -> None:
    batch_id, lines = _batch(stores, 5, expires_after_s=60)
    kept_id, kept_lines = _batch(stores, 2, expires_after_s=None)
    _finish(stores, lines[:3])
    stores.jobs.claim_jobs(lines[3:], worker="w", lease_s=60)
    stores.jobs.finish_jobs(
        [JobOutcome(job_id=j, error=JobError(code="x", message="no")) for j in lines[3:]]
    )
    _finish(stores, kept_lines)
    for done in (batch_id, kept_id):
        stores.batches.start_finalizing(done)
        stores.batches.finish_finalizing(
            done, output=_size(3), errors=_size(2) if done == batch_id else _size(0)
        )
    ended = stores.batches.get(batch_id)
    assert ended.output_expires_after_s == 60
    assert ended.output_expires_at == stores.clock.now + timedelta(seconds=60)
    assert ended.output_file_id is not None
    assert ended.error_file_id is not None
    assert stores.files.get(ended.output_file_id).expires_at == ended.output_expires_at

    stores.clock.now += timedelta(seconds=61)
    # Expired: hidden before retention runs, in reads and in lists.
    with pytest.raises(NotFound):
        stores.batches.get(batch_id, scope="t")
    with pytest.raises(NotFound):
        stores.files.get(ended.output_file_id)
    assert [b.id for b in stores.batches.page(scope="t").items] == [kept_id]

    report = stores.retention().run_once()
    assert report.deleted == {"batch_lines": 5, "batches": 1}
    assert stores.count(JobRow, JobRow.batch_id == batch_id) == 0
    assert stores.count(FileRow, FileRow.batch_id == batch_id) == 0
    assert stores.batches.get(kept_id).counts.completed == 2
    assert stores.count(JobRow, JobRow.batch_id == kept_id) == 2


def test_an_expired_file_is_hidden_then_its_chunks_and_row_go(stores: Stores) -> None:
    big = _upload(stores, expires_after_s=3600, chunks=100)
    kept = _upload(stores, expires_after_s=None)
    later = _upload(stores, expires_after_s=7200)
    assert stores.files.get(big).expires_at == stores.clock.now + timedelta(hours=1)
    assert stores.files.get(kept).expires_at is None
    stores.clock.now += timedelta(hours=1, seconds=1)
    with pytest.raises(NotFound):
        stores.files.get(big)
    assert {f.id for f in stores.files.page(scope="t").items} == {kept, later}

    report = stores.retention().run_once()
    assert report.deleted == {"file_chunks": 100, "files": 1}
    assert stores.count(FileChunkRow, FileChunkRow.file_id == big) == 0
    assert stores.count(FileRow, FileRow.id == big) == 0
    assert stores.files.get(later).id == later


def test_ended_webhook_deliveries_and_expired_idempotency_keys_are_pruned(
    stores: Stores,
) -> None:
    now = stores.clock.now
    with stores.sessions.begin() as session:
        session.execute(
            insert(WebhookEndpointRow).values(
                id="we_1", tenant="t", url="http://x", secret="s", created_at=now
            )
        )
        for i, finished in enumerate([now, None]):
            session.execute(
                insert(WebhookDeliveryRow).values(
                    id=f"wd_{i}",
                    tenant="t",
                    endpoint_id="we_1",
                    event="job.succeeded",
                    state="delivered" if finished else "pending",
                    attempts=1,
                    next_attempt_at=now,
                    created_at=now,
                    finished_at=finished,
                )
            )
            session.execute(
                insert(WebhookAttemptRow).values(delivery_id=f"wd_{i}", number=1, started_at=now)
            )
    old = IdempotentRequest(key_id="k", key="old")
    stores.idempotency.begin(old, request_hash="h", ttl_s=60)
    stores.clock.now += timedelta(seconds=DAY + 1)
    fresh = IdempotentRequest(key_id="k", key="fresh")
    stores.idempotency.begin(fresh, request_hash="h", ttl_s=60)

    report = stores.retention().run_once()
    assert report.deleted == {"webhook_deliveries": 1, "idempotency_keys": 1}
    assert stores.count(WebhookDeliveryRow) == 1
    assert stores.count(WebhookAttemptRow, WebhookAttemptRow.delivery_id == "wd_0") == 0
    with stores.sessions() as session:
        assert session.scalars(select(IdempotencyKeyRow.key)).all() == ["fresh"]


def test_batch_counters_agree_with_the_lines_through_every_way_a_line_ends(
    stores: Stores,
) -> None:
    batch_id, lines = _batch(stores, 10, expires_after_s=None)
    assert stores.batches.get(batch_id).counts.total == 10
    stores.jobs.claim_jobs(lines[:6], worker="w", lease_s=60)
    stores.jobs.finish_jobs(
        [JobOutcome(job_id=j, result=job_result(completion_tokens=4)) for j in lines[:3]]
        + [JobOutcome(job_id=lines[3], error=JobError(code="x", message="no"))]
    )
    # A result for a line that already ended counts nothing.
    assert stores.jobs.finish_jobs([JobOutcome(job_id=lines[0], result=job_result())]) == []
    stores.jobs.cancel_job(lines[4])
    batch, _ = stores.batches.stop(batch_id, code="batch_cancelled", message="cancelled")
    counts, usage = batch.counts, batch.usage
    assert (counts.total, counts.completed, counts.failed) == (10, 3, 7)
    assert (usage.input_tokens, usage.output_tokens) == (9, 12)
    with stores.sessions() as session:
        by_status = dict(
            session.execute(
                select(JobRow.status, func.count())
                .where(JobRow.batch_id == batch_id)
                .group_by(JobRow.status)
            ).all()
        )
    assert by_status == {"succeeded": 3, "failed": 1, "cancelled": 6}
    assert stores.batches.get(batch_id).counts == counts


def test_a_flush_ending_lines_waits_for_their_batch_before_it_locks_a_line(
    database_url: str, postgres_stores: Stores
) -> None:
    """Lines are ended with their batch's row locked first, as a cancel locks them; a
    flush that locked a line first would deadlock against a cancel holding the batch."""
    stores = postgres_stores
    batch_id, [line] = _batch(stores, 1, expires_after_s=None)
    stores.jobs.claim_jobs([line], worker="w", lease_s=60)
    engine = create_engine(database_url)
    with engine.connect() as cancel, engine.connect() as probe:
        cancel.execute(select(BatchRow.id).where(BatchRow.id == batch_id).with_for_update())
        with ThreadPoolExecutor(1) as pool:
            flush = pool.submit(
                stores.jobs.finish_jobs, [JobOutcome(job_id=line, result=job_result())]
            )
            try:
                _until_a_lock_is_awaited(probe)
                # The flush waits on the batch, holding no line: the line is free to lock.
                probe.execute(text("SET LOCAL lock_timeout = '1ms'"))
                locked = probe.execute(
                    select(JobRow.id).where(JobRow.id == line).with_for_update()
                ).all()
                assert [row.id for row in locked] == [line]
                probe.rollback()
                assert not flush.done()
            finally:
                cancel.rollback()  # the cancel ends: the flush goes on
            assert flush.result(timeout=30) == [line]
    engine.dispose()
    assert stores.batches.get(batch_id).counts.completed == 1


def _until_a_lock_is_awaited(connection: Connection, timeout_s: float = 30) -> None:
    """Returns once some session of this database waits on a lock."""
    deadline = time.monotonic() + timeout_s
    query = text(
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )
    while not connection.execute(query).scalar():
        connection.rollback()
        assert time.monotonic() < deadline, "the flush never waited on the batch's lock"
        time.sleep(0.01)
    connection.rollback()


def _size(lines: int) -> FileSize:
    return FileSize(bytes=lines * 10, lines=lines)


def test_the_migration_counts_the_lines_of_batches_made_before_counters(
    database_url: str, postgres_stores: Stores
) -> None:
    """A deployment's existing batches: back to the schema before counters, then up again."""
    stores = postgres_stores
    batch_id, lines = _batch(stores, 6, expires_after_s=None)
    stores.jobs.claim_jobs(lines[:3], worker="w", lease_s=60)
    stores.jobs.finish_jobs(
        [JobOutcome(job_id=j, result=job_result(completion_tokens=5)) for j in lines[:2]]
        + [JobOutcome(job_id=lines[2], error=JobError(code="x", message="no"))]
    )
    stores.jobs.cancel_job(lines[3])
    before = stores.batches.get(batch_id)
    command.downgrade(alembic_config(database_url), "0007")
    upgrade(database_url)
    after = stores.batches.get(batch_id)
    assert (after.counts, after.usage) == (before.counts, before.usage)
    assert (after.counts.total, after.counts.completed, after.counts.failed) == (6, 2, 2)
    assert (after.usage.input_tokens, after.usage.output_tokens) == (6, 10)
