"""The paced engine keeps a GPU's time: steps scheduled as vLLM schedules them, each as long
as its table says, running on whether or not the loop collects their output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from inferq.domain.jobs import SamplingParams
from inferq.settings import Settings
from worker.engine.factory import build_engine
from worker.engine.paced import TOKEN_TEXT, PacedEngine, StepTimes
from worker.engine.protocol import EngineRequest

# 10 ms a step up to 4 tokens, then 1 ms more a token; 2 ms per 1,000 tokens of context.
TIMES = StepTimes(
    tokens_ms=((1, 10.0), (4, 10.0), (104, 110.0)),
    context_ms_per_1k=2.0,
    max_num_batched_tokens=8,
    async_scheduling=False,
)


class Clock:
    """Time that passes only when the engine sleeps (or a test says so)."""

    def __init__(self) -> None:
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def engine(times: StepTimes = TIMES, *, max_num_seqs: int = 4) -> tuple[PacedEngine, Clock]:
    clock = Clock()
    return PacedEngine(
        times=times, max_num_seqs=max_num_seqs, clock=lambda: clock.now, sleep=clock.sleep
    ), clock


def request(
    job_id: str, *, prompt: int = 2, tokens: int = 3, priority: int = 0, stream: bool = False
) -> EngineRequest:
    return EngineRequest(
        job_id=job_id,
        prompt_token_ids=list(range(prompt)),
        sampling=SamplingParams(max_tokens=tokens),
        priority=priority,
        stream=stream,
    )


def run(paced: PacedEngine, clock: Clock) -> dict[str, float]:
    """Step until idle: when each job finished."""
    ended: dict[str, float] = {}
    while not paced.idle:
        for finished in paced.step():
            ended[finished.job_id] = clock.now
    return ended


def test_a_step_lasts_what_its_table_says_for_its_tokens_and_context() -> None:
    assert TIMES.step_s(tokens=1, context=0) == pytest.approx(0.010)
    assert TIMES.step_s(tokens=54, context=0) == pytest.approx(0.060)
    assert TIMES.step_s(tokens=204, context=0) == pytest.approx(0.210)  # beyond the last point
    assert TIMES.step_s(tokens=4, context=500) == pytest.approx(0.011)
    assert TIMES.scaled(0.5).step_s(tokens=4, context=500) == pytest.approx(0.0055)


def test_a_request_takes_its_prompt_then_a_step_a_token_and_ends_with_placeholders() -> None:
    paced, clock = engine()
    paced.add(request("a", prompt=2, tokens=3))
    ended = run(paced, clock)
    # The first step computes the prompt and makes the first token; two more make the rest.
    # Context: 0, then 3, then 4 tokens.
    assert ended["a"] == pytest.approx(0.010 + 0.010006 + 0.010008)
    assert paced.steps == 3


def test_prompts_are_cut_into_chunks_under_the_token_budget() -> None:
    paced, clock = engine()
    paced.add(request("long", prompt=20, tokens=1))
    ended = run(paced, clock)
    assert paced.steps == 3  # 8 + 8 + 4 prompt tokens, the token made with the last chunk
    assert ended["long"] == pytest.approx(
        TIMES.step_s(tokens=8, context=0)
        + TIMES.step_s(tokens=8, context=8)
        + TIMES.step_s(tokens=4, context=16)
    )


def test_running_sequences_are_capped_and_the_waiting_go_by_priority() -> None:
    paced, clock = engine(max_num_seqs=2)
    for job_id, priority in (("late", 5), ("first", 0), ("second", 1)):
        paced.add(request(job_id, prompt=1, tokens=2, priority=priority))
    ended = run(paced, clock)
    assert ended["first"] == ended["second"] < ended["late"]
    assert paced.steps == 4


def test_the_engine_runs_on_while_nobody_collects_its_output() -> None:
    paced, clock = engine()
    paced.add(request("a", tokens=2))
    paced.add(request("b", tokens=5))
    clock.now = 1.0  # the loop was away for a second: every step ran meanwhile
    assert [f.job_id for f in paced.step()] == []  # the first step's output
    assert [f.job_id for f in paced.step()] == ["a"]
    assert clock.now == 1.0
    assert paced.busy_s == pytest.approx(5 * 0.010, rel=0.01)


def test_a_request_added_mid_step_joins_the_next_or_with_async_scheduling_the_one_after() -> None:
    # Step 1 runs from 10 to 20 ms; a request added at 15 ms joins step 2 (20-30 ms), or
    # with asynchronous scheduling step 3 (30-40 ms), scheduled as step 2 starts.
    for async_scheduling, joins_at in ((False, 2), (True, 3)):
        times = StepTimes(
            tokens_ms=TIMES.tokens_ms,
            context_ms_per_1k=0.0,
            max_num_batched_tokens=8,
            async_scheduling=async_scheduling,
        )
        paced, clock = engine(times)
        paced.add(request("first", prompt=1, tokens=10))
        paced.step()
        clock.now = 0.015  # mid step 1
        paced.add(request("late", prompt=1, tokens=1))
        ended = run(paced, clock)
        assert ended["late"] == pytest.approx(0.010 * (joins_at + 1))


def test_an_aborted_request_ends_without_output() -> None:
    paced, clock = engine()
    paced.add(request("kept", tokens=3))
    paced.add(request("dropped", tokens=3))
    paced.step()
    paced.abort(["dropped"])
    assert set(run(paced, clock)) == {"kept"}


def test_streamed_requests_get_a_token_a_step() -> None:
    paced, _ = engine()
    paced.add(request("s", tokens=2, stream=True))
    assert paced.step() == []
    [delta] = paced.deltas()
    assert delta.choices[0].text == TOKEN_TEXT
    assert (delta.choices[0].offset, delta.choices[0].finish_reason) == (0, None)
    [finished] = paced.step()
    [last] = paced.deltas()
    assert (last.choices[0].offset, last.choices[0].finish_reason) == (1, "length")
    assert finished.result.choices[0].text == TOKEN_TEXT * 2
    assert finished.result.completion_tokens == 2


def test_settings_build_it_from_a_calibration_table(tmp_path: Path) -> None:
    table = tmp_path / "table.json"
    table.write_text(
        json.dumps(
            {
                "source": "a test",
                "tokens_ms": [[1, 5.0], [256, 12.0]],
                "context_ms_per_1k": 0.05,
                "max_num_batched_tokens": 1024,
            }
        )
    )
    built = build_engine(
        Settings(engine="paced", allow_benchmark_engine=True, paced_engine_table=table)
    )
    assert isinstance(built, PacedEngine)
    built.add(request("a", tokens=1))
    [finished] = built.step()
    assert finished.job_id == "a"
