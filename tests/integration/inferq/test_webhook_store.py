"""The webhook outbox and delivery store on real Postgres (and SQLite): deliveries are
written with the results, claimed under a lease, and retried, dead-lettered or disabled
as the attempts say."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from inferq.domain.jobs import JobError, JobOutcome
from inferq.domain.webhooks import Attempt, DeliveryState, WebhookRequest
from inferq.store.database import make_database, make_sessions
from inferq.store.jobs import JobStore, NewJob
from inferq.store.migrate import upgrade
from inferq.store.webhooks import WebhookStore
from tests.helpers.clock import Clock
from tests.helpers.jobs import create_jobs, job_result, job_spec


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["postgres", "sqlite"])
def stores(
    request: pytest.FixtureRequest, tmp_path: Path, clock: Clock
) -> Iterator[tuple[JobStore, WebhookStore, list[int]]]:
    if request.param == "postgres":
        url = str(request.getfixturevalue("database_url"))
    else:
        url = f"sqlite:///{tmp_path / 'store.db'}"
        upgrade(url)
    engine = make_database(url, pool_size=2)
    sessions = make_sessions(engine)
    wakes: list[int] = []
    yield (
        JobStore(sessions, clock=clock, on_webhooks=lambda: wakes.append(1)),
        WebhookStore(sessions, clock=clock),
        wakes,
    )
    engine.dispose()


def _attempt(number: int, status: int | None, clock: Clock) -> Attempt:
    return Attempt(
        number=number, started_at=clock.now, status_code=status, latency_ms=5, error=None
    )


Stores = tuple[JobStore, WebhookStore, list[int]]


def test_deliveries_are_written_with_results_for_the_events_asked(stores: Stores) -> None:
    jobs, hooks, wakes = stores
    url = "https://hooks.example.com/a"
    a, b = create_jobs(
        jobs,
        [job_spec(), job_spec()],
        queue="interactive",
        webhook=WebhookRequest(url),
    )
    [only_failures] = create_jobs(
        jobs,
        [job_spec()],
        queue="interactive",
        webhook=WebhookRequest(url, ["job.failed"]),
    )
    [plain] = create_jobs(jobs, [job_spec()], queue="interactive")
    jobs.cancel_job(b.id)
    written = jobs.finish_jobs(
        [
            JobOutcome(job_id=a.id, result=job_result()),
            JobOutcome(job_id=b.id, result=job_result()),  # already cancelled: not written
            JobOutcome(job_id=only_failures.id, result=job_result()),
            JobOutcome(job_id=plain.id, error=JobError(code="x", message="y")),
        ]
    )
    assert written == [a.id, only_failures.id, plain.id]
    deliveries, _ = hooks.page(scope="t")
    assert sorted((d.job_id, d.event) for d in deliveries) == sorted(
        [(a.id, "job.succeeded"), (b.id, "job.cancelled")]
    )
    assert all(d.state is DeliveryState.PENDING and d.url == url for d in deliveries)
    assert len(wakes) == 2  # after the cancel's commit, and after the results'
    [endpoint] = hooks.endpoints(scope="t")
    assert endpoint.secret.startswith("whsec_")
    assert hooks.endpoints(scope="someone-else") == []


def test_jobs_submitted_together_with_and_without_a_webhook_each_keep_their_own(
    stores: Stores,
) -> None:
    jobs, hooks, _ = stores
    url = "https://hooks.example.com/mixed"
    hooked, plain, failing = jobs.submit_jobs(
        [
            NewJob(spec=job_spec("a"), tenant="t", webhook=WebhookRequest(url)),
            NewJob(spec=job_spec("b"), tenant="t"),
            NewJob(spec=job_spec("c"), tenant="t", webhook=WebhookRequest(url, ["job.failed"])),
        ],
        queue="interactive",
        requeue_after_s=60,
    )
    assert [jobs.get_job(j.id).prompt for j in (hooked, plain, failing)] == ["a", "b", "c"]
    jobs.finish_jobs(
        [
            JobOutcome(job_id=hooked.id, result=job_result()),
            JobOutcome(job_id=plain.id, error=JobError(code="x", message="y")),
            JobOutcome(job_id=failing.id, error=JobError(code="x", message="y")),
        ]
    )
    deliveries, _ = hooks.page(scope="t")
    assert sorted((d.job_id, d.event) for d in deliveries) == sorted(
        [(hooked.id, "job.succeeded"), (failing.id, "job.failed")]
    )


def test_a_claim_leases_each_due_delivery_to_one_sender(stores: Stores, clock: Clock) -> None:
    jobs, hooks, _ = stores
    [job] = create_jobs(
        jobs,
        [job_spec()],
        queue="interactive",
        webhook=WebhookRequest("https://hooks.example.com/b"),
    )
    jobs.finish_jobs([JobOutcome(job_id=job.id, result=job_result())])
    [(delivery, endpoint)] = hooks.claim_due(limit=10, lease_s=30)
    assert delivery.attempts == 1
    assert endpoint.url == "https://hooks.example.com/b"
    assert hooks.claim_due(limit=10, lease_s=30) == []
    # The sender died: the lease lapses, the lost attempt is recorded, it goes again.
    clock.now += timedelta(seconds=31)
    [(again, _)] = hooks.claim_due(limit=10, lease_s=30)
    assert again.attempts == 2
    assert hooks.record(again, _attempt(2, 500, clock), retry_in_s=5) is DeliveryState.PENDING
    assert hooks.claim_due(limit=10, lease_s=30) == []
    clock.now += timedelta(seconds=6)
    [(third, _)] = hooks.claim_due(limit=10, lease_s=30)
    assert hooks.record(third, _attempt(3, 200, clock), retry_in_s=5) is DeliveryState.SUCCEEDED
    done = hooks.get(third.id, scope="t")
    assert [a.status_code for a in done.history] == [None, 500, 200]
    assert "stopped before this attempt ended" in (done.history[0].error or "")


def test_the_last_failure_dead_letters_and_410_disables_the_endpoint(
    stores: Stores, clock: Clock
) -> None:
    jobs, hooks, _ = stores
    webhook = WebhookRequest("https://hooks.example.com/c")
    a, b, c = create_jobs(jobs, [job_spec()] * 3, queue="interactive", webhook=webhook)
    jobs.finish_jobs([JobOutcome(job_id=j.id, result=job_result()) for j in (a, b)])
    first, second = (d for d, _ in hooks.claim_due(limit=10, lease_s=30))
    assert hooks.record(first, _attempt(1, 503, clock), retry_in_s=None) is DeliveryState.DEAD
    gone = hooks.record(second, _attempt(1, 410, clock), retry_in_s=None, disable_endpoint="410")
    assert gone is DeliveryState.DISABLED
    [endpoint] = hooks.endpoints(scope="t")
    assert endpoint.disabled_reason == "410"
    # Later events for a disabled endpoint are not sent.
    jobs.finish_jobs([JobOutcome(job_id=c.id, result=job_result())])
    assert hooks.claim_due(limit=10, lease_s=30) == []
    [latest, *_] = hooks.page(scope="t")[0]
    assert (latest.job_id, latest.state) == (c.id, DeliveryState.DISABLED)
    # Replay: refused while disabled, then sent again under the same id.
    with pytest.raises(Exception, match="enable it first"):
        hooks.replay(second.id, scope="t")
    hooks.set_enabled(endpoint.id, scope="t", reason=None)
    replayed = hooks.replay(second.id, scope="t")
    assert replayed.state is DeliveryState.PENDING
    [(claimed, _)] = hooks.claim_due(limit=10, lease_s=30)
    assert claimed.id == second.id
