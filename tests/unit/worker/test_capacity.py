import threading
import time

from tests.helpers.waiting import wait_until
from worker.capacity import CapacityGate


def _acquire_later(
    gate: CapacityGate, count: int, *, order: list[str], name: str
) -> threading.Thread:
    def run() -> None:
        if gate.acquire(count):
            order.append(name)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def _waiting(gate: CapacityGate, count: int) -> None:
    wait_until(lambda: gate.waiting == count, timeout_s=10, what=f"{count} single jobs waiting")


def _room(gate: CapacityGate) -> int:
    """How many single jobs get in right now, one after the other (all given back)."""
    taken = 0
    while taken < 100 and gate.acquire(1, timeout_s=0):
        taken += 1
    gate.release(taken)
    return taken


def test_batch_lines_take_what_room_there_is_and_give_it_back() -> None:
    gate = CapacityGate(4)
    assert gate.reserve(3) == 3
    assert gate.reserve(8) == 1
    assert gate.reserve(8) == 0
    gate.release(2)
    # Less free than the feeder is willing to claim for: it takes nothing yet.
    assert gate.reserve(8, least=3) == 0
    assert gate.reserve(8, least=2) == 2
    gate.release(4)
    assert _room(gate) == 4


def test_a_waiting_single_job_holds_batch_lines_back() -> None:
    gate = CapacityGate(2)
    assert gate.reserve(1) == 1
    order: list[str] = []
    # Two single jobs do not fit beside the line held, and while they wait no batch line
    # gets in, though one would fit.
    single = _acquire_later(gate, 2, order=order, name="single")
    _waiting(gate, 1)
    assert gate.reserve(1) == 0
    assert not gate.wait_for_room(1, timeout_s=0.05)
    gate.release(1)
    single.join(2)
    assert order == ["single"]
    assert gate.reserve(1) == 0
    gate.release(2)
    assert gate.wait_for_room(2, timeout_s=0.05)
    assert gate.reserve(5) == 2


def test_the_feeder_is_woken_when_room_frees() -> None:
    gate = CapacityGate(2)
    assert gate.reserve(2) == 2
    freed = threading.Timer(0.05, gate.release, args=(2,))
    freed.start()
    assert gate.wait_for_room(2, timeout_s=10)
    freed.join()


def test_a_request_larger_than_the_gate_gets_in_when_it_is_empty() -> None:
    gate = CapacityGate(4)
    assert gate.acquire(16)
    gate.release(16)
    assert _room(gate) == 4


def test_closing_turns_waiters_away() -> None:
    gate = CapacityGate(1)
    assert gate.acquire(1)
    order: list[str] = []
    waiter = _acquire_later(gate, 1, order=order, name="late")
    _waiting(gate, 1)
    gate.close()
    waiter.join(2)
    assert order == []
    gate.release(1)
    assert not gate.acquire(1)
    assert gate.reserve(1) == 0
    assert not gate.wait_for_room(1, timeout_s=0.05)


def test_single_jobs_have_room_of_their_own_past_a_full_gate() -> None:
    gate = CapacityGate(2, interactive_extra=1)
    assert gate.reserve(2) == 2
    assert gate.reserve(1) == 0
    assert gate.acquire(1, timeout_s=0.05)
    assert not gate.acquire(1, timeout_s=0.05)
    gate.release(3)
    assert _room(gate) == 3


def test_a_timed_acquire_gives_up_and_takes_nothing() -> None:
    gate = CapacityGate(1)
    assert gate.acquire(1)
    started = time.monotonic()
    assert not gate.acquire(1, timeout_s=0.1)
    assert 0.09 <= time.monotonic() - started < 2
    gate.release(1)
    assert gate.acquire(1, timeout_s=0.1)
    assert _room(gate) == 0


def test_waiting_single_jobs_get_in_in_the_order_they_came() -> None:
    gate = CapacityGate(1)
    assert gate.acquire(1)
    order: list[str] = []
    names = [f"job-{i}" for i in range(6)]
    threads = []
    for number, name in enumerate(names):
        threads.append(_acquire_later(gate, 1, order=order, name=name))
        _waiting(gate, number + 1)
    for number in range(len(names)):
        gate.release(1)
        wait_until(lambda n=number: len(order) == n + 1, timeout_s=10, what="the next in")
    for thread in threads:
        thread.join(2)
    assert order == names


def test_room_is_there_while_open_unheld_and_unwaited_for() -> None:
    gate = CapacityGate(2)
    assert gate.has_room
    assert gate.reserve(2) == 2
    assert not gate.has_room
    gate.release(2)
    assert gate.has_room
    gate.close()  # a draining worker takes nothing more: it has no room to be stuck with
    assert not gate.has_room
