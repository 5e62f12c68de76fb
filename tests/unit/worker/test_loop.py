"""The engine loop on a fake engine: continuous admission, bounds, aborts, engine death."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry

from inferq.broker.token_stream import JobDelta, RunStarted, TokenEvent
from inferq.domain.jobs import JobOutcome, SamplingParams, engine_priority
from tests.helpers.fakes import StepEngine
from tests.helpers.waiting import wait_until
from worker.admission import AdmissionQueue
from worker.engine.protocol import EngineRequest, Finished
from worker.loop import EngineLoop
from worker.metrics import WorkerMetrics
from worker.speedometer import Speedometer


class _Tokens(list[TokenEvent]):
    """The loop's token events, in order."""

    def put(self, events: Sequence[TokenEvent]) -> None:
        self.extend(events)


class Harness:
    def __init__(
        self,
        *,
        engine: StepEngine,
        max_num_seqs: int,
        max_batch_size: int = 64,
        replacement: Callable[[], StepEngine] = StepEngine,
    ) -> None:
        self.engines = [engine]
        self._replacement = replacement
        self.outcomes: dict[str, JobOutcome] = {}
        self.fatal: list[BaseException] = []
        self.tokens = _Tokens()
        self._done = threading.Condition()
        self.admission = AdmissionQueue(max_batch_size=max_batch_size, max_batch_delay_ms=0)
        self.registry = CollectorRegistry()
        self.speed = Speedometer(max_num_seqs=max_num_seqs)
        self.loop = EngineLoop(
            engine=engine,
            engine_factory=self._new_engine,
            admission=self.admission,
            writer=self,
            on_fatal=self.fatal.append,
            metrics=WorkerMetrics(self.registry),
            speed=self.speed,
            max_num_seqs=max_num_seqs,
            max_engine_deaths=3,
            tokens=self.tokens,
        )

    def _new_engine(self) -> StepEngine:
        engine = self._replacement()
        self.engines.append(engine)
        return engine

    def put(self, outcome: JobOutcome) -> None:
        """The loop's writer: what it hands on, kept by job."""
        with self._done:
            self.outcomes[outcome.job_id] = outcome
            self._done.notify_all()

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value

    def submit(self, lengths: dict[str, int], *, stream: bool = False, bulk: bool = False) -> None:
        self.admission.put(
            [
                EngineRequest(
                    job_id=job_id,
                    prompt_token_ids=[1, 2],
                    sampling=SamplingParams(max_tokens=n),
                    stream=stream,
                    priority=engine_priority(0, single=not bulk),
                    bulk=bulk,
                )
                for job_id, n in lengths.items()
            ],
            single=not bulk,
        )

    def wait_for(self, count: int, timeout_s: float = 5) -> None:
        with self._done:
            assert self._done.wait_for(lambda: len(self.outcomes) >= count, timeout_s), (
                f"only {len(self.outcomes)} of {count} finished"
            )


@pytest.fixture
def make_harness() -> Iterator[type[Harness]]:
    made: list[Harness] = []

    def build(**kwargs: object) -> Harness:
        harness = Harness(**kwargs)  # type: ignore[arg-type]
        made.append(harness)
        harness.loop.start()
        return harness

    yield build  # type: ignore[misc]
    for harness in made:
        harness.loop.stop(5)


def test_finished_sequences_make_room_for_pending_ones_at_once(make_harness) -> None:
    engine = StepEngine()
    harness = make_harness(engine=engine, max_num_seqs=4)
    # One long request and many short ones: a batch-at-a-time loop would leave three
    # slots empty while the long one runs; continuous admission keeps all four busy.
    harness.submit({"long": 40, **{f"short{i}": 2 for i in range(30)}})
    harness.wait_for(31)
    assert max(engine.batch_sizes) == 4
    full_steps = sum(1 for size in engine.batch_sizes if size == 4)
    assert full_steps >= 0.9 * (30 * 2 / 3)
    assert all(o.result is not None for o in harness.outcomes.values())


def test_a_batch_lines_outcome_says_so_for_the_writer(make_harness) -> None:
    harness = make_harness(engine=StepEngine(), max_num_seqs=4)
    harness.submit({"line": 2}, bulk=True)
    harness.submit({"job": 2})
    harness.wait_for(2)
    assert harness.outcomes["line"].bulk
    assert not harness.outcomes["job"].bulk


def test_in_flight_never_exceeds_max_num_seqs(make_harness) -> None:
    engine = StepEngine()
    harness = make_harness(engine=engine, max_num_seqs=5, max_batch_size=3)
    harness.submit({f"j{i}": 1 + i % 4 for i in range(50)})
    harness.wait_for(50)
    assert max(engine.batch_sizes) <= 5
    assert sorted(harness.outcomes) == sorted(f"j{i}" for i in range(50))


def test_an_abort_drops_running_and_pending_requests(make_harness) -> None:
    engine = StepEngine()
    harness = make_harness(engine=engine, max_num_seqs=1)
    harness.submit({"running": 10_000_000, "pending": 1, "other": 1})
    wait_until(lambda: "running" in engine.running, timeout_s=5, what="running", interval_s=0.01)
    harness.loop.abort(["running", "pending"])
    harness.wait_for(1)
    assert list(harness.outcomes) == ["other"]
    assert engine.aborted == ["running"]
    assert "pending" not in engine.admitted


def test_a_request_the_engine_refuses_fails_alone(make_harness) -> None:
    harness = make_harness(engine=StepEngine(reject="bad"), max_num_seqs=4)
    harness.submit({"a": 2, "bad": 2, "b": 2})
    harness.wait_for(3)
    assert harness.outcomes["bad"].error is not None
    assert harness.outcomes["bad"].error.code == "engine_rejected"
    assert harness.outcomes["a"].result is not None
    assert harness.outcomes["b"].result is not None


def test_engine_death_restarts_the_engine_and_fails_only_the_poison(make_harness) -> None:
    # The replacement engines die on the poison too, as a real one would.
    harness = make_harness(
        engine=StepEngine(poison="poison"),
        max_num_seqs=8,
        replacement=lambda: StepEngine(poison="poison"),
    )
    harness.submit({"poison": 3, "a": 3, "b": 5})
    harness.wait_for(3)
    poison = harness.outcomes["poison"]
    assert poison.error is not None
    assert poison.error.code == "engine_crash"
    assert "3 times" in poison.error.message
    assert harness.outcomes["a"].result is not None
    assert harness.outcomes["b"].result is not None
    assert harness.loop.engine_restarts == 3
    assert all(e.closed for e in harness.engines[:-1])
    assert not harness.fatal
    # Stopping closes the engine the loop holds now: the last replacement.
    assert not harness.engines[-1].closed
    harness.loop.stop(5)
    assert harness.engines[-1].closed


def test_metrics_count_admissions_outcomes_and_restarts(make_harness) -> None:
    harness = make_harness(
        engine=StepEngine(poison="poison"),
        max_num_seqs=8,
        replacement=lambda: StepEngine(poison="poison"),
    )
    harness.submit({"a": 2, "b": 3, "poison": 1})
    harness.wait_for(3)
    assert harness.metric("inferq_jobs_finished_total", outcome="succeeded", reason="length") == 2
    assert (
        harness.metric("inferq_jobs_finished_total", outcome="failed", reason="engine_crash") == 1
    )
    assert harness.metric("inferq_engine_restarts_total") == 3
    assert harness.metric("inferq_generation_tokens_total") == 5
    assert harness.metric("inferq_prompt_tokens_total") == 4
    assert harness.metric("inferq_sequences_in_flight") == 0
    assert harness.metric("inferq_admission_batch_size_count") >= 1


def test_the_in_flight_gauge_follows_the_engine(make_harness) -> None:
    engine = StepEngine()
    harness = make_harness(engine=engine, max_num_seqs=4)
    harness.submit({"long": 10_000_000, "other": 10_000_000})

    def in_flight() -> float:
        return harness.metric("inferq_sequences_in_flight")

    def aborted() -> float:
        return harness.metric("inferq_jobs_finished_total", outcome="aborted", reason="cancelled")

    wait_until(lambda: in_flight() >= 2, timeout_s=5, what="two in flight", interval_s=0.01)
    assert in_flight() == 2
    harness.loop.abort(["long"])
    # Counted once the abort is done, the sequence already dropped.
    wait_until(lambda: aborted() >= 1, timeout_s=5, what="aborted", interval_s=0.01)
    assert aborted() == 1
    assert in_flight() == 1
    harness.loop.abort(["other"])


def test_streamed_requests_report_their_start_and_every_step_and_others_nothing(
    make_harness,
) -> None:
    harness = make_harness(engine=StepEngine(), max_num_seqs=4)
    harness.submit({"quiet": 3})
    harness.submit({"loud": 3}, stream=True)
    harness.wait_for(2)
    assert harness.tokens[0] == RunStarted(job_id="loud")
    deltas = harness.tokens[1:]
    assert all(isinstance(d, JobDelta) and d.job_id == "loud" for d in deltas)
    choices = [c for d in deltas if isinstance(d, JobDelta) for c in d.choices]
    assert [(c.offset, c.tokens, c.finish_reason) for c in choices] == [
        (0, 1, None),
        (1, 1, None),
        (2, 1, "length"),
    ]
    result = harness.outcomes["loud"].result
    assert result is not None
    assert result.choices[0].text == "".join(c.text for c in choices)


def test_a_streamed_request_readmitted_after_an_engine_death_starts_again(make_harness) -> None:
    harness = make_harness(
        engine=StepEngine(poison="poison"),
        max_num_seqs=8,
        replacement=lambda: StepEngine(poison="poison"),
    )
    harness.submit({"loud": 4}, stream=True)
    harness.submit({"poison": 1})
    harness.wait_for(2)
    starts = [e for e in harness.tokens if isinstance(e, RunStarted)]
    # Admitted, then re-admitted after each of the poison's three engine deaths (the last
    # time alone, on probation).
    assert len(starts) >= 2
    assert harness.outcomes["loud"].result is not None


class _BusyEngine(StepEngine):
    """Spends `cpu_s` of its thread's CPU in each call."""

    def __init__(self, cpu_s: float) -> None:
        super().__init__()
        self.cpu_s = cpu_s
        self.spent_s = 0.0

    def _spend(self) -> None:
        began = time.thread_time()
        while time.thread_time() - began < self.cpu_s:
            pass
        self.spent_s += time.thread_time() - began

    def add(self, request: EngineRequest) -> None:
        self._spend()
        super().add(request)

    def step(self) -> list[Finished]:
        self._spend()
        return super().step()


def test_the_engines_cpu_is_counted_apart_from_the_loops(make_harness) -> None:
    engine = _BusyEngine(cpu_s=0.002)
    harness = make_harness(engine=engine, max_num_seqs=4)
    harness.submit({"a": 5, "b": 8})
    harness.wait_for(2)
    counted = harness.metric("inferq_engine_cpu_seconds_total")
    # Two admissions and eight steps, each 2 ms of the engine's: all of it counted, and
    # little of the loop's own beside it.
    assert engine.spent_s >= 0.02
    assert engine.spent_s <= counted <= engine.spent_s + 0.01
