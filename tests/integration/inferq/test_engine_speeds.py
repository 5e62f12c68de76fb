"""The speeds the GPU workers report for batch estimates (inferq/store/engine_speeds.py),
on Postgres and on SQLite (`inferq run`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest

from inferq.store.database import make_database, make_sessions
from inferq.store.engine_speeds import SpeedStore
from tests.helpers.clock import Clock


@pytest.fixture
def speeds(store_url: str, clock: Clock) -> Iterator[SpeedStore]:
    engine = make_database(store_url, pool_size=2)
    yield SpeedStore(make_sessions(engine), clock=clock)
    engine.dispose()


def report(
    speeds: SpeedStore,
    worker: str,
    *,
    rate: float | None,
    fallback: float | None = None,
    fraction: float | None = 0.5,
    step: float | None = None,
    model: str = "m",
) -> None:
    speeds.report(
        worker=worker,
        model=model,
        runner="generate",
        tokens_per_s=rate,
        fallback_tokens_per_s=fallback,
        step_s=step,
        output_fraction=fraction,
        interactive_tokens_per_s=3.0,
    )


def test_a_rate_not_measured_this_time_keeps_the_last_one(speeds: SpeedStore, clock: Clock) -> None:
    report(speeds, "w1", rate=None, fallback=None)
    assert speeds.of_model("m") == []  # a worker that never worked says nothing
    report(speeds, "w1", rate=None, fallback=40.0)
    [first] = speeds.of_model("m")
    assert first.tokens_per_s == 40.0  # at any load, until measured full ...
    assert not first.at_load  # ... and said to be so: no estimate is made from it
    report(speeds, "w1", rate=900.0, fraction=0.4, step=0.01)
    clock.now += timedelta(seconds=5)
    report(speeds, "w1", rate=None, fallback=40.0, fraction=None, step=None)
    [speed] = speeds.of_model("m")
    assert (speed.tokens_per_s, speed.output_fraction, speed.step_s) == (900.0, 0.4, 0.01)
    assert speed.reported_at == clock.now
    assert speed.interactive_tokens_per_s == 3.0
    assert speed.at_load


def test_gone_workers_are_forgotten_but_the_newest_of_each_model(
    speeds: SpeedStore, clock: Clock
) -> None:
    report(speeds, "old", rate=100.0)
    report(speeds, "other-model", rate=100.0, model="n")
    clock.now += timedelta(seconds=30)
    report(speeds, "newer", rate=200.0)
    clock.now += timedelta(days=30)
    assert speeds.forget_gone(after_s=86400) == 1
    assert [s.worker for s in speeds.of_model("m")] == ["newer"]
    assert [s.worker for s in speeds.of_model("n")] == ["other-model"]
