import threading
import time

from tests.helpers.waiting import wait_until
from worker.capacity import CapacityGate


def _acquire_later(
    gate: CapacityGate, count: int, *, interactive: bool, order: list[str], name: str
) -> threading.Thread:
    def run() -> None:
        if gate.acquire(count, interactive=interactive):
            order.append(name)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _bulk_waiting(gate: CapacityGate, count: int) -> None:
    wait_until(lambda: gate.bulk_waiting == count, timeout_s=10, what=f"{count} bulk waiting")


def _room(gate: CapacityGate, *, interactive: bool = False) -> int:
    """How many single jobs get in right now, one after the other (all given back)."""
    taken = 0
    while taken < 100 and gate.acquire(1, interactive=interactive, timeout_s=0):
        taken += 1
    gate.release(taken)
    return taken


def test_room_is_shared_and_given_back() -> None:
    gate = CapacityGate(4)
    assert gate.acquire(3, interactive=False)
    order: list[str] = []
    waiter = _acquire_later(gate, 2, interactive=False, order=order, name="bulk")
    _bulk_waiting(gate, 1)
    assert order == []
    gate.release(1)
    waiter.join(2)
    assert order == ["bulk"]
    assert _room(gate) == 0


def test_interactive_work_goes_before_waiting_bulk_work() -> None:
    gate = CapacityGate(2)
    assert gate.acquire(1, interactive=False)
    assert _room(gate) == 1
    order: list[str] = []
    # Two interactive jobs do not fit beside the one held, and while they wait no bulk
    # job gets in, though one would fit.
    interactive = _acquire_later(gate, 2, interactive=True, order=order, name="interactive")
    wait_until(lambda: _room(gate) == 0, timeout_s=10, what="bulk work held back")
    bulk = _acquire_later(gate, 1, interactive=False, order=order, name="bulk")
    _bulk_waiting(gate, 1)
    gate.release(1)
    interactive.join(2)
    assert order == ["interactive"]
    gate.release(2)
    bulk.join(2)
    assert order == ["interactive", "bulk"]


def test_a_request_larger_than_the_gate_gets_in_when_it_is_empty() -> None:
    gate = CapacityGate(4)
    assert gate.acquire(16, interactive=False)
    gate.release(16)
    assert _room(gate) == 4


def test_closing_turns_waiters_away() -> None:
    gate = CapacityGate(1)
    assert gate.acquire(1, interactive=False)
    order: list[str] = []
    waiter = _acquire_later(gate, 1, interactive=False, order=order, name="late")
    _bulk_waiting(gate, 1)
    gate.close()
    waiter.join(2)
    assert order == []
    assert not gate.acquire(1, interactive=True)


def test_single_jobs_have_room_of_their_own_past_a_full_gate() -> None:
    gate = CapacityGate(2, interactive_extra=1)
    assert gate.acquire(2, interactive=False)
    assert not gate.acquire(1, interactive=False, timeout_s=0.05)
    assert gate.acquire(1, interactive=True, timeout_s=0.05)
    assert not gate.acquire(1, interactive=True, timeout_s=0.05)
    gate.release(3)
    assert _room(gate) == 2


def test_a_timed_acquire_gives_up_and_takes_nothing() -> None:
    gate = CapacityGate(1)
    assert gate.acquire(1, interactive=True)
    started = time.monotonic()
    assert not gate.acquire(1, interactive=True, timeout_s=0.1)
    assert 0.09 <= time.monotonic() - started < 2
    gate.release(1)
    assert gate.acquire(1, interactive=True, timeout_s=0.1)
    assert _room(gate, interactive=True) == 0


def test_it_counts_the_batch_chunks_waiting_for_room() -> None:
    gate = CapacityGate(1)
    assert gate.acquire(1, interactive=False)
    order: list[str] = []
    waiter = _acquire_later(gate, 1, interactive=False, order=order, name="bulk")
    _bulk_waiting(gate, 1)
    gate.release(1)
    waiter.join(2)
    assert gate.bulk_waiting == 0
    assert order == ["bulk"]


def test_bulk_work_waits_behind_bulk_work_that_came_first() -> None:
    # A worker holds a message per thread here; let in at random, a batch queued later
    # took the engine from one queued before it.
    gate = CapacityGate(4)
    assert gate.acquire(3, interactive=False)
    order: list[str] = []
    first = _acquire_later(gate, 2, interactive=False, order=order, name="first")
    _bulk_waiting(gate, 1)
    # One place is free: enough for a later chunk of one, which still waits its turn.
    assert not gate.acquire(1, interactive=False, timeout_s=0.2)
    gate.release(1)
    first.join(2)
    assert order == ["first"]
    gate.release(1)
    assert gate.acquire(1, interactive=False, timeout_s=0.2)


def test_waiting_chunks_get_in_in_the_order_they_came() -> None:
    gate = CapacityGate(1)
    assert gate.acquire(1, interactive=False)
    order: list[str] = []
    names = [f"chunk-{i}" for i in range(6)]
    threads = []
    for number, name in enumerate(names):
        threads.append(_acquire_later(gate, 1, interactive=False, order=order, name=name))
        _bulk_waiting(gate, number + 1)
    for number in range(len(names)):
        gate.release(1)
        wait_until(lambda n=number: len(order) == n + 1, timeout_s=10, what="the next in")
    for thread in threads:
        thread.join(2)
    assert order == names


def test_room_is_there_while_open_unheld_and_unwaited_for() -> None:
    gate = CapacityGate(2)
    assert gate.has_room
    assert gate.acquire(2, interactive=False)
    assert not gate.has_room
    gate.release(2)
    assert gate.has_room
    gate.close()  # a draining worker takes nothing more: it has no room to be stuck with
    assert not gate.has_room
