import threading
import time

from inferq.domain.jobs import SamplingParams, ServiceTier, engine_priority
from worker.admission import AdmissionQueue
from worker.engine.protocol import EngineRequest


def _requests(*ids: str) -> list[EngineRequest]:
    return [
        EngineRequest(job_id=i, prompt_token_ids=[1], sampling=SamplingParams(max_tokens=1))
        for i in ids
    ]


def _ids(requests: list[EngineRequest]) -> list[str]:
    return [r.job_id for r in requests]


def test_interactive_requests_are_admitted_before_bulk_ones() -> None:
    queue = AdmissionQueue(max_batch_size=8, max_batch_delay_ms=0)
    queue.put(_requests("b1", "b2"), single=False)
    queue.put(_requests("i1"), single=True)
    assert _ids(queue.take(2, idle=False, timeout_s=0)) == ["i1", "b1"]
    assert _ids(queue.take(2, idle=False, timeout_s=0)) == ["b2"]


def test_a_take_is_bounded_by_room_alone() -> None:
    # What a step computes is the engine's scheduler's to bound: a burst larger than a
    # micro-batch enters at once, so none of it waits a step for the next take.
    queue = AdmissionQueue(max_batch_size=3, max_batch_delay_ms=0)
    queue.put(_requests(*"abcdefg"), single=True)
    queue.put(_requests(*"hijklmn"), single=False)
    assert len(queue.take(5, single_room=6, idle=False, timeout_s=0)) == 6
    assert len(queue.take(5, idle=False, timeout_s=0)) == 5
    assert queue.take(0, idle=False, timeout_s=0) == []
    assert len(queue) == 3


def test_an_idle_engine_waits_up_to_the_delay_for_a_micro_batch() -> None:
    queue = AdmissionQueue(max_batch_size=4, max_batch_delay_ms=300)
    queue.put(_requests("a"), single=False)

    def more() -> None:
        time.sleep(0.05)
        queue.put(_requests("b", "c", "d"), single=False)

    threading.Thread(target=more).start()
    started = time.monotonic()
    taken = queue.take(10, idle=True, timeout_s=1)
    assert _ids(taken) == ["a", "b", "c", "d"]
    # A full batch goes at once instead of waiting out the delay.
    assert time.monotonic() - started < 0.25


def test_an_idle_engine_takes_a_partial_batch_when_the_delay_runs_out() -> None:
    queue = AdmissionQueue(max_batch_size=4, max_batch_delay_ms=50)
    queue.put(_requests("a"), single=False)
    started = time.monotonic()
    assert _ids(queue.take(10, idle=True, timeout_s=1)) == ["a"]
    assert 0.04 <= time.monotonic() - started < 0.5


def test_a_wake_ends_an_idle_wait_whether_it_comes_during_or_before_it() -> None:
    # The engine loop waits long when idle: an abort or a stop must not wait that out.
    queue = AdmissionQueue(max_batch_size=4, max_batch_delay_ms=0)
    waker = threading.Timer(0.05, queue.wake)
    waker.start()
    started = time.monotonic()
    assert queue.take(10, idle=True, timeout_s=30) == []
    assert time.monotonic() - started < 10
    queue.wake()
    started = time.monotonic()
    assert queue.take(10, idle=True, timeout_s=30) == []
    assert time.monotonic() - started < 10
    # Once taken, a wake is spent: the next take waits out its timeout.
    started = time.monotonic()
    assert queue.take(10, idle=True, timeout_s=0.2) == []
    assert time.monotonic() - started >= 0.2


def test_a_busy_engine_never_waits() -> None:
    queue = AdmissionQueue(max_batch_size=4, max_batch_delay_ms=10_000)
    queue.put(_requests("a"), single=True)
    started = time.monotonic()
    assert _ids(queue.take(10, idle=False, timeout_s=5)) == ["a"]
    assert queue.take(10, idle=False, timeout_s=5) == []
    assert time.monotonic() - started < 0.1


def test_remove_takes_out_pending_requests() -> None:
    queue = AdmissionQueue(max_batch_size=8, max_batch_delay_ms=0)
    queue.put(_requests("a", "b"), single=True)
    queue.put(_requests("c"), single=False)
    assert _ids(queue.remove({"b", "c", "zzz"})) == ["b", "c"]
    assert _ids(queue.drain()) == ["a"]


def test_a_single_job_never_waits_for_a_micro_batch() -> None:
    queue = AdmissionQueue(max_batch_size=4, max_batch_delay_ms=10_000)
    queue.put(_requests("b"), single=False)
    queue.put(_requests("i"), single=True)
    started = time.monotonic()
    assert _ids(queue.take(10, idle=True, timeout_s=5)) == ["i", "b"]
    assert time.monotonic() - started < 1


def _prioritized(job_id: str, priority: int) -> EngineRequest:
    return EngineRequest(
        job_id=job_id,
        prompt_token_ids=[1],
        sampling=SamplingParams(max_tokens=1),
        priority=priority,
    )


def test_requests_are_taken_by_priority_then_arrival() -> None:
    queue = AdmissionQueue(max_batch_size=8, max_batch_delay_ms=0)
    queue.put([_prioritized("b0", engine_priority(0, single=False))], single=False)
    queue.put(
        [
            _prioritized("i5", engine_priority(5, single=True)),
            _prioritized("i0", engine_priority(0, single=True)),
            _prioritized("i5b", engine_priority(5, single=True)),
        ],
        single=True,
    )
    assert _ids(queue.take(8, idle=False, timeout_s=0)) == ["i0", "i5", "i5b", "b0"]


def test_single_jobs_may_use_the_slots_kept_for_them_and_batch_lines_may_not() -> None:
    queue = AdmissionQueue(max_batch_size=8, max_batch_delay_ms=0)
    queue.put(_requests("b1", "b2"), single=False)
    # The engine is full of batch lines (room 0) but has two interactive slots free.
    assert queue.take(0, single_room=2, idle=False, timeout_s=0) == []
    queue.put(_requests("i1", "i2", "i3"), single=True)
    assert _ids(queue.take(0, single_room=2, idle=False, timeout_s=0)) == ["i1", "i2"]
    assert _ids(queue.take(1, single_room=3, idle=False, timeout_s=0)) == ["i3"]
    assert _ids(queue.take(1, single_room=3, idle=False, timeout_s=0)) == ["b1"]


def test_service_tiers_order_single_jobs_and_flex_runs_as_batch_lines_do() -> None:
    def asked(job_id: str, tier: ServiceTier) -> EngineRequest:
        priority = engine_priority(tier.priority, single=True)
        return EngineRequest(
            job_id=job_id,
            prompt_token_ids=[1],
            sampling=SamplingParams(max_tokens=1),
            priority=priority,
        )

    queue = AdmissionQueue(max_batch_size=8, max_batch_delay_ms=0)
    queue.put(_requests("line"), single=False)
    queue.put(
        [
            asked("flex", ServiceTier.FLEX),
            asked("default", ServiceTier.asked("auto")),
            asked("priority", ServiceTier.PRIORITY),
        ],
        single=True,
    )
    assert _ids(queue.take(4, idle=False, timeout_s=0)) == ["priority", "default", "flex", "line"]
    # In the engine, flex runs at the priority of batch lines: behind single jobs,
    # preempted first.
    assert engine_priority(ServiceTier.FLEX.priority, single=True) == engine_priority(
        0, single=False
    )
