"""Batch lines claimed in the order work is shared: fairly between tenants by weight, by
priority, window and age within a tenant, each batch in input order; a flex single job
counts in its tenant's share. On Postgres and on SQLite (`inferq run`'s store)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import insert, update

from inferq.domain.batches import BatchStatus
from inferq.domain.fair_share import ALONE, FleetShare
from inferq.domain.jobs import JobSpec, SamplingParams, ServiceTier
from inferq.store.api_keys import KeyStore
from inferq.store.database import make_database, make_sessions
from inferq.store.job_rows import BatchPlace, new_job_row
from inferq.store.jobs import JobStore
from inferq.store.models import BatchRow, JobRow
from tests.helpers.clock import Clock

QUEUE = "bulk:tiny"
SPEC = JobSpec(
    model="tiny",
    prompt="hi",
    messages=None,
    prompt_token_ids=[0, 5, 6],
    sampling=SamplingParams(max_tokens=4),
)


class Batches:
    """Batches written straight into the store, as batch creation writes them."""

    def __init__(self, store: JobStore, keys: KeyStore, clock: Clock) -> None:
        self.store = store
        self.keys = keys
        self.clock = clock
        self._count = 0

    def add(
        self,
        tenant: str,
        lines: int,
        *,
        priority: int = 0,
        window: timedelta = timedelta(hours=24),
        queue: str = QUEUE,
    ) -> str:
        self._count += 1
        batch_id = f"batch_{self._count:03d}_{tenant}"
        now = self.clock()
        rows = [
            new_job_row(
                SPEC,
                tenant=tenant,
                queue=queue,
                now=now,
                requeue_after_s=3600,
                place=BatchPlace(batch_id, line, f"line-{line}", priority),
            )
            for line in range(lines)
        ]
        with self.store._transaction() as session:
            session.add(
                BatchRow(
                    id=batch_id,
                    tenant=tenant,
                    endpoint="/v1/completions",
                    input_file_id="file_x",
                    completion_window="24h",
                    status=BatchStatus.IN_PROGRESS.value,
                    metadata_={},
                    created_at=now,
                    expires_at=now + window,
                    priority=priority,
                    request_total=lines,
                )
            )
            session.execute(insert(JobRow), rows)
        self.clock.now += timedelta(seconds=1)
        return batch_id

    def single_jobs(self, tenant: str, count: int, *, tier: ServiceTier) -> list[str]:
        """`count` single jobs of `tenant`'s at `tier`, claimed by a worker as it is asked."""
        spec = dataclasses.replace(SPEC, priority=tier.priority)
        rows = [
            new_job_row(
                spec, tenant=tenant, queue="interactive:tiny", now=self.clock(), requeue_after_s=60
            )
            for _ in range(count)
        ]
        with self.store._transaction() as session:
            session.execute(insert(JobRow), rows)
        ids = [str(row["id"]) for row in rows]
        claimed = self.store.claim_jobs(ids, worker="w", lease_s=60)
        assert [job.flex for job in claimed] == [tier is ServiceTier.FLEX] * count
        return ids

    def claim(
        self, limit: int, *, queue: str = QUEUE, fleet: FleetShare = ALONE, worker: str = "w"
    ) -> list[tuple[str, int]]:
        """(batch, line) of each line claimed."""
        claimed = self.store.claim_batch_lines(
            queue=queue, worker=worker, lease_s=60, limit=limit, fleet=fleet
        )
        with self.store._transaction() as session:
            lines = dict(
                session.execute(
                    JobRow.__table__.select()
                    .with_only_columns(JobRow.id, JobRow.line)
                    .where(JobRow.id.in_([job.id for job in claimed]))
                ).all()
            )
        return [(str(job.batch_id), lines[job.id]) for job in claimed]

    def tenants(self, claimed: list[tuple[str, int]]) -> Counter[str]:
        return Counter(batch_id.rsplit("_", 1)[1] for batch_id, _ in claimed)


@pytest.fixture
def batches(store_url: str, clock: Clock) -> Iterator[Batches]:
    engine = make_database(store_url, pool_size=2)
    sessions = make_sessions(engine)
    yield Batches(JobStore(sessions, clock=clock), KeyStore(sessions, clock=clock), clock)
    engine.dispose()


def test_a_tenant_alone_gets_every_line_in_input_order(batches: Batches) -> None:
    big = batches.add("a", 30)
    claimed = batches.claim(20) + batches.claim(20)
    assert claimed == [(big, line) for line in range(30)]
    assert batches.claim(20) == []


def test_a_later_tenant_shares_at_once_and_lines_keep_their_order(batches: Batches) -> None:
    big = batches.add("a", 100)
    assert batches.claim(10) == [(big, line) for line in range(10)]
    small = batches.add("b", 10)
    claimed = batches.claim(10)
    # Half each, from the next claim on: A's 10 earlier lines earn B no credit either.
    assert batches.tenants(claimed) == Counter({"a": 5, "b": 5})
    claimed += batches.claim(20)
    assert [line for batch, line in claimed if batch == small] == list(range(10))
    # B has 5 left for the last claim: A gets the rest of it.
    assert [line for batch, line in claimed if batch == big] == list(range(10, 30))


def test_weights_set_the_shares(batches: Batches) -> None:
    heavy, _ = batches.keys.create(name="heavy")
    batches.keys.update(heavy.id, weight=3)
    batches.add("light", 200)
    batches.add("heavy", 200)
    claimed = [line for _ in range(10) for line in batches.claim(8)]
    assert batches.tenants(claimed) == Counter({"light": 20, "heavy": 60})


def test_flex_single_jobs_count_in_their_tenants_share(batches: Batches) -> None:
    batches.add("a", 40)
    batches.add("b", 40)
    batches.single_jobs("a", 6, tier=ServiceTier.FLEX)
    batches.single_jobs("b", 6, tier=ServiceTier.DEFAULT)
    # A's six flex jobs stand for six of its lines: B's lines catch up first, then the
    # two take turns; B's default single jobs are not batch work and count for nothing.
    assert batches.tenants(batches.claim(12)) == Counter({"b": 9, "a": 3})
    # A tenant with no lines waiting counts them too: C's next batch joins four lines
    # behind the others, which take turns until C has caught up.
    batches.single_jobs("c", 4, tier=ServiceTier.FLEX)
    batches.add("c", 40)
    assert batches.tenants(batches.claim(12)) == Counter({"a": 6, "b": 5, "c": 1})


def test_within_a_tenant_priority_then_the_closing_window_then_age(batches: Batches) -> None:
    low = batches.add("a", 3, priority=9)
    old = batches.add("a", 3, priority=0)
    closing = batches.add("a", 3, priority=0, window=timedelta(hours=1))
    claimed = [batch for batch, _ in batches.claim(9)]
    assert claimed == [closing] * 3 + [old] * 3 + [low] * 3


def test_only_the_queue_asked_for_and_only_queued_lines(batches: Batches) -> None:
    mine = batches.add("a", 4)
    batches.add("b", 4, queue="bulk:other")
    assert batches.claim(2) == [(mine, 0), (mine, 1)]
    with batches.store._transaction() as session:
        session.execute(
            update(JobRow)
            .where(JobRow.batch_id == mine, JobRow.line == 2)
            .values(status="cancelled")
        )
    assert batches.claim(10) == [(mine, 3)]


def test_a_worker_of_a_fleet_claims_no_more_than_its_share_of_the_lines_left(
    batches: Batches,
) -> None:
    # 100 lines between four workers: each takes a quarter, however much room it has, so
    # a batch too small to fill every engine runs on all of them.
    small = batches.add("acme", 100)
    fleet = FleetShare(workers=4)
    first = batches.claim(1000, fleet=fleet, worker="w1")
    assert first == [(small, line) for line in range(25)]
    # What a worker holds counts against its share; another worker gets the next lines.
    assert batches.claim(1000, fleet=FleetShare(workers=4, held={small: 25})) == []
    second = batches.claim(1000, fleet=fleet, worker="w2")
    assert second == [(small, line) for line in range(25, 50)]
    # Alone, a worker takes all there is room for.
    assert len(batches.claim(1000, worker="w3")) == 50
