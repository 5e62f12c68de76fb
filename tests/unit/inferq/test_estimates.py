"""Batch estimates' arithmetic (inferq/domain/estimates.py): what a client is told about
when its batch ends and what it costs, from the workers' measured speed and the work
before it."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from inferq.domain.estimates import (
    LIVE_S,
    BatchWork,
    EngineSpeed,
    Estimate,
    ModelSpeed,
    estimate,
)

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def work(
    batch_id: str = "b",
    *,
    lines: int = 100,
    max_tokens: int = 100,
    ended: int = 0,
    output_tokens: int = 0,
    prompt_tokens: int = 20,
) -> BatchWork:
    return BatchWork(
        batch_id=batch_id,
        created_at=NOW,
        lines=lines,
        ended=ended,
        succeeded=ended,
        prompt_tokens=prompt_tokens * lines,
        max_tokens=max_tokens * lines,
        longest_tokens=max_tokens,
        input_tokens=prompt_tokens * ended,
        output_tokens=output_tokens,
    )


def speed(
    worker: str = "w1",
    *,
    tokens_per_s: float = 1000,
    fraction: float | None = 0.5,
    interactive: float = 0,
    age_s: float = 0,
    step_s: float | None = None,
) -> EngineSpeed:
    return EngineSpeed(
        worker=worker,
        model="m",
        runner="generate",
        tokens_per_s=tokens_per_s,
        output_fraction=fraction,
        step_s=step_s,
        interactive_tokens_per_s=interactive,
        reported_at=NOW - timedelta(seconds=age_s),
    )


def seconds_to(when: datetime) -> float:
    return (when - NOW).total_seconds()


def made(
    batch: BatchWork,
    *speeds: EngineSpeed,
    others: tuple[BatchWork, ...] = (),
    runner: str = "generate",
) -> Estimate:
    result = estimate(
        batch, others=others, speed=ModelSpeed.of(speeds, now=NOW), runner=runner, now=NOW
    )
    assert result is not None
    return result


def test_a_new_batch_takes_its_expected_output_over_the_measured_rate() -> None:
    # 100 lines of up to 100 tokens, lines generating half their max_tokens: 5,000 tokens.
    result = made(work(), speed())
    assert seconds_to(result.completion_at) == pytest.approx(5.0)
    assert result.output_tokens == 5000
    assert result.output_tokens_max == 10_000
    assert result.input_tokens == 2000
    # Every line to its max_tokens is the latest; the earliest is a quarter sooner.
    assert seconds_to(result.latest_at) == pytest.approx(10.0)
    assert seconds_to(result.earliest_at) == pytest.approx(3.75)
    # Lines known to run to their max_tokens: the rate's quarter either way.
    known = made(work(), speed(fraction=1.0))
    assert seconds_to(known.earliest_at) == pytest.approx(7.5)
    assert seconds_to(known.latest_at) == pytest.approx(12.5)


def test_another_tenants_work_shares_the_rate_by_weight() -> None:
    # 10,000 tokens of one tenant's beside 5,000 of another's: half the rate each until
    # the smaller ends (10 s), then the rest alone (5 s more).
    big, small = work("a", lines=200), dataclasses.replace(work("b"), tenant="other")
    big = dataclasses.replace(big, tenant="one")
    small_end = made(small, speed(), others=(big,))
    assert seconds_to(small_end.completion_at) == pytest.approx(10.0)
    assert small_end.tokens_per_s == pytest.approx(500)
    assert small_end.tokens_ahead == 5000
    assert seconds_to(made(big, speed(), others=(small,)).completion_at) == pytest.approx(15.0)
    # At weight 3 the small one gets three quarters: it ends at 5,000 / 750 s.
    heavy = dataclasses.replace(small, weight=3.0)
    assert seconds_to(made(heavy, speed(), others=(big,)).completion_at) == pytest.approx(20 / 3)
    assert seconds_to(made(big, speed(), others=(heavy,)).completion_at) == pytest.approx(15.0)
    # At the latest, all of the other tenant's work goes first.
    assert seconds_to(small_end.latest_at) == pytest.approx((10_000 + 10_000) / 1000)


def test_within_a_tenant_priority_goes_first() -> None:
    later = dataclasses.replace(work("a", lines=200), priority=9)
    urgent = work("b")
    result = made(urgent, speed(), others=(later,))
    assert result.tokens_ahead == 0
    assert seconds_to(result.completion_at) == pytest.approx(5.0)


def test_the_work_queued_before_it_is_run_first() -> None:
    before = work("a", lines=200)
    result = made(work(), speed(), others=(before,))
    assert result.tokens_ahead == 10_000
    assert seconds_to(result.completion_at) == pytest.approx(15.0)


def test_workers_add_up_and_single_jobs_take_their_share() -> None:
    alone = made(work(), speed("w1"), speed("w2"))
    assert alone.tokens_per_s == 2000
    shared = made(work(), speed("w1", interactive=500), speed("w2", interactive=500))
    assert shared.tokens_per_s == 1000
    assert seconds_to(shared.completion_at) == pytest.approx(2 * seconds_to(alone.completion_at))
    # However busy the interactive side, a batch is not estimated to stop.
    flooded = made(work(), speed(interactive=5000))
    assert flooded.tokens_per_s == pytest.approx(100)


def test_a_gone_worker_is_not_counted_but_stands_in_when_none_is_live() -> None:
    live_and_gone = made(work(), speed("w1"), speed("w2", age_s=LIVE_S + 1))
    assert live_and_gone.tokens_per_s == 1000
    # Scaled to zero: the newest measurement stands for the worker that will take it.
    gone = made(work(), speed("w1", tokens_per_s=400, age_s=600), speed("w2", age_s=7200))
    assert gone.tokens_per_s == 400


def test_longer_lines_than_the_models_count_as_soon_as_5_percent_have_ended() -> None:
    # The model's lines generate half their max_tokens; this batch's run to the end.
    early = made(work(lines=1000, ended=10, output_tokens=10 * 100), speed())
    assert 0.5 < early.output_tokens / early.output_tokens_max < 1.0
    running = made(work(lines=1000, ended=50, output_tokens=50 * 100), speed())
    assert running.output_tokens == running.output_tokens_max == 100_000
    assert seconds_to(running.completion_at) == pytest.approx(95.0)


def test_shorter_lines_than_the_models_count_only_by_the_share_ended() -> None:
    # The lines that end first are the shortest: a tenth of the lines generated a tenth of
    # their max_tokens while the model's generate half. The rest are expected between.
    running = made(work(lines=1000, ended=100, output_tokens=1000), speed())
    fraction = 0.1 * 0.1 + 0.9 * 0.5
    assert running.output_tokens == 1000 + round(900 * 100 * fraction)
    assert running.output_tokens_max == 1000 + 900 * 100
    assert seconds_to(running.completion_at) == pytest.approx(900 * 100 * fraction / 1000)
    # Near its end, the batch's own share.
    late = made(work(lines=1000, ended=900, output_tokens=9000), speed())
    assert late.output_tokens == 9000 + round(100 * 100 * (0.9 * 0.1 + 0.1 * 0.5))


def test_unmeasured_lengths_are_taken_at_their_max_tokens() -> None:
    result = made(work(), speed(fraction=None))
    assert result.output_tokens == result.output_tokens_max == 10_000


def test_embeddings_are_counted_in_prompt_tokens() -> None:
    result = made(work(lines=100, prompt_tokens=50, ended=50), speed(), runner="pooling")
    assert seconds_to(result.completion_at) == pytest.approx(2.5)
    assert result.output_tokens == result.output_tokens_max == 0


def test_no_estimate_before_any_worker_measured_the_model() -> None:
    assert ModelSpeed.of([], now=NOW) is None
    assert estimate(work(), others=(), speed=None, runner="generate", now=NOW) is None


def test_no_estimate_from_a_rate_not_measured_at_load() -> None:
    # A fresh worker's rate over one job says nothing of a large batch's: confident and
    # wrong is worse than none.
    low = dataclasses.replace(speed(tokens_per_s=5), at_load=False)
    assert (
        estimate(work(), others=(), speed=ModelSpeed.of([low], now=NOW), runner="generate", now=NOW)
        is None
    )
    # One worker measured at load is enough.
    both = ModelSpeed.of([low, speed("w2")], now=NOW)
    assert estimate(work(), others=(), speed=both, runner="generate", now=NOW) is not None


def test_an_estimate_keeps_through_json() -> None:
    result = made(work(), speed())
    assert Estimate.from_dict(result.to_dict()) == result


def test_an_estimate_kept_by_an_earlier_version_still_reads() -> None:
    kept = made(work(), speed()).to_dict() | {"done_tokens": 500, "pace_tokens_per_s": 2.0}
    assert Estimate.from_dict(kept) == made(work(), speed())


def test_a_running_batch_behind_another_keeps_its_place_while_none_of_its_lines_end() -> None:
    # A few of its lines ran beside the batch ahead's last ones; then none end for a minute
    # while the batch ahead runs. Each pass the end comes no later than the pass before
    # said (measured on the bench, a batch's pace put it 43 times its length too late).
    ahead = [
        work("a", lines=1500, ended=ended, output_tokens=ended * 50)
        for ended in (100, 400, 700, 1000)
    ]
    mine = work(lines=200, ended=8, output_tokens=8 * 50)
    speeds = ModelSpeed.of([speed()], now=NOW)
    ends = []
    for seconds, batch_ahead in zip((0, 15, 30, 45), ahead, strict=True):
        result = estimate(
            mine,
            others=(batch_ahead,),
            speed=speeds,
            runner="generate",
            now=NOW + timedelta(seconds=seconds),
        )
        assert result is not None
        assert result.tokens_per_s == 1000
        ends.append(result.completion_at)
    # The batch ahead ran 300 lines of 50 tokens (15 s) in each 15 s: the end holds still.
    assert [seconds_to(end) for end in ends] == pytest.approx([seconds_to(ends[0])] * 4)


def test_its_longest_line_keeps_the_engine_after_the_rest() -> None:
    # 5 s of work at the rate, then its longest line (100 tokens at half) alone, 20 ms a step.
    result = made(work(), speed(step_s=0.02))
    assert seconds_to(result.completion_at) == pytest.approx(5.0 + 50 * 0.02)
    # At the latest, every line to its max_tokens, the longest too.
    assert seconds_to(result.latest_at) == pytest.approx(10.0 + 100 * 0.02)
