"""What a worker measures of its engine for batch estimates (worker/speedometer.py)."""

from __future__ import annotations

import pytest

from worker.speedometer import BUCKET_S, SINGLE_JOB_WINDOW_S, WINDOW_S, Speedometer


class Ticks:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def run(meter: Speedometer, ticks: Ticks, *, steps: int, sequences: int, step_s: float) -> None:
    for _ in range(steps):
        ticks.now += step_s
        meter.stepped(duration_s=step_s, sequences=sequences)


def test_the_rate_is_taken_with_the_engine_at_least_half_full() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, clock=ticks)
    # 10 s at 16 sequences, 0.1 s a step: 160 tokens/s. Then 10 s of one sequence at
    # 0.05 s a step (20 tokens/s), which a large batch would never see.
    run(meter, ticks, steps=100, sequences=16, step_s=0.1)
    run(meter, ticks, steps=200, sequences=1, step_s=0.05)
    reading = meter.reading()
    assert reading.full_tokens_per_s == pytest.approx(160)
    assert reading.busy_tokens_per_s == pytest.approx((1600 + 200) / 20)


def test_too_little_time_at_full_load_is_no_measurement() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, clock=ticks)
    run(meter, ticks, steps=10, sequences=16, step_s=0.1)
    run(meter, ticks, steps=100, sequences=2, step_s=0.1)
    reading = meter.reading()
    assert reading.full_tokens_per_s is None
    assert reading.busy_tokens_per_s == pytest.approx(360 / 11)


def test_what_ends_gives_the_output_fraction_and_the_interactive_rate() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, clock=ticks)
    meter.finished(prompt_tokens=5, completion_tokens=30, max_tokens=100, single=False)
    meter.finished(prompt_tokens=5, completion_tokens=60, max_tokens=100, single=True)
    reading = meter.reading()
    assert reading.output_fraction == pytest.approx(0.45)
    assert reading.interactive_tokens_per_s == pytest.approx(60 / SINGLE_JOB_WINDOW_S)
    # A minute on, single jobs no longer count; the fraction is kept over the window.
    ticks.now += SINGLE_JOB_WINDOW_S + 2 * BUCKET_S
    later = meter.reading()
    assert later.interactive_tokens_per_s == 0
    assert later.output_fraction == pytest.approx(0.45)


def test_the_window_forgets_old_work() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, clock=ticks)
    run(meter, ticks, steps=100, sequences=16, step_s=0.1)
    ticks.now += WINDOW_S + BUCKET_S
    reading = meter.reading()
    assert reading.full_tokens_per_s is None
    assert reading.busy_tokens_per_s is None
    assert reading.output_fraction is None


def test_embeddings_count_the_prompt_tokens_they_embed() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, pooling=True, clock=ticks)
    run(meter, ticks, steps=60, sequences=4, step_s=0.1)
    for _ in range(60):
        meter.finished(prompt_tokens=50, completion_tokens=0, max_tokens=1, single=False)
    reading = meter.reading()
    assert reading.full_tokens_per_s == pytest.approx(3000 / 6)
    assert reading.output_fraction is None


def run_admitting(meter: Speedometer, ticks: Ticks, *, steps: int, step_s: float) -> None:
    for _ in range(steps):
        ticks.now += step_s
        meter.stepped(duration_s=step_s, sequences=1, admitted=True)


def test_steps_with_few_sequences_give_what_a_batchs_last_lines_cost_beyond_their_tokens() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, clock=ticks)
    run(meter, ticks, steps=100, sequences=16, step_s=0.1)  # 160 tokens/s full
    assert meter.reading().tail_step_s is None
    # One sequence at 0.02 s a step, as on a GPU: its token would take 1/160 s at the
    # full rate, so a last line's step costs 0.01375 s more.
    run(meter, ticks, steps=30, sequences=1, step_s=0.02)
    assert meter.reading().tail_step_s == pytest.approx(0.02 - 1 / 160)


def test_a_step_as_quick_as_its_tokens_at_the_full_rate_costs_the_tail_nothing() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, clock=ticks)
    run(meter, ticks, steps=100, sequences=16, step_s=0.1)
    # As on a CPU: a step's time follows its sequences (1 sequence, 1/160 s).
    run(meter, ticks, steps=30, sequences=1, step_s=0.1 / 16)
    assert meter.reading().tail_step_s == pytest.approx(0.0, abs=1e-9)


def test_steps_that_fill_prompts_do_not_count_as_a_last_lines_steps() -> None:
    ticks = Ticks()
    meter = Speedometer(max_num_seqs=16, clock=ticks)
    run(meter, ticks, steps=100, sequences=16, step_s=0.1)
    # A batch's first steps: few sequences, each step filling the prompts just admitted.
    run_admitting(meter, ticks, steps=30, step_s=0.5)
    assert meter.reading().tail_step_s is None
    run(meter, ticks, steps=30, sequences=1, step_s=0.02)
    assert meter.reading().tail_step_s == pytest.approx(0.02 - 1 / 160)
