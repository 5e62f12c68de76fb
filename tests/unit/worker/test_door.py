"""The door: the one count of what a worker holds, single jobs before batch lines."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from inferq.domain.jobs import ClaimedJob, SamplingParams
from worker.door import Door


def _job(job_id: str, batch_id: str | None = None) -> ClaimedJob:
    return ClaimedJob(
        id=job_id,
        model="fake",
        prompt_token_ids=[1],
        sampling=SamplingParams(max_tokens=1),
        created_at=datetime.now(UTC),
        batch_id=batch_id,
    )


def _claim_all(door: Door) -> list[str]:
    """What the feeder does with the messages asked for that fit: claims every job."""
    taken = door.take_asked()
    ids = [job_id for asked in taken for job_id in asked.tickets]
    door.hold([_job(j) for j in ids], taken=taken)
    return ids


def _lines(door: Door, count: int, *, least: int = 1) -> list[str]:
    """The feeder reserving room for batch lines and claiming `count` of them."""
    room = door.reserve(1 << 30, least=least)
    ids = [f"line-{len(door)}-{i}" for i in range(min(room, count))]
    door.hold([_job(j, "batch") for j in ids], reserved=room)
    return ids


def test_batch_lines_take_what_room_there_is_and_give_it_back() -> None:
    door = Door(4)
    assert len(_lines(door, 3)) == 3
    assert door.reserve(8) == 1
    door.unreserve(1)
    # Less free than the feeder is willing to claim for: it takes nothing yet.
    assert door.reserve(8, least=2) == 0
    held = _lines(door, 8)
    assert len(held) == 1
    assert len(door) == 4
    door.let_go(held)
    assert door.reserve(8, least=2) == 0
    assert door.reserve(8) == 1


def test_single_jobs_asked_for_come_first_and_hold_batch_lines_back() -> None:
    door = Door(2)
    _lines(door, 1)
    # Two single jobs do not fit beside the line held; while they wait no line gets in.
    tickets = door.ask(["a", "b"])
    assert door.take_asked() == []
    assert door.reserve(1) == 0
    assert not door.wait(0.01, room_for=1)
    door.let_go(door.held_ids())
    assert door.wait(0.01)  # the message fits now
    assert _claim_all(door) == ["a", "b"]
    assert sorted(door.held_ids()) == ["a", "b"]
    assert not any(t.ended for t in tickets)
    door.let_go(["a", "b"])
    assert all(t.ended and not t.returned for t in tickets)


def test_the_feeder_is_woken_by_room_a_message_put_back_or_a_wake_up() -> None:
    door = Door(2)
    _lines(door, 2)
    freed = threading.Timer(0.05, door.let_go, args=(door.held_ids(),))
    freed.start()
    assert door.wait(10, room_for=2)
    freed.join()
    # A message that fits is claimed by its asker: it wakes nobody.
    door.ask(["a"])
    taken = door.take_asked()
    # Its claim failed: the feeder is woken to claim it.
    put_back = threading.Timer(0.05, door.put_back, args=(taken,))
    put_back.start()
    assert door.wait(10)
    put_back.join()
    assert _claim_all(door) == ["a"]
    door.wake()
    assert door.wait(0)
    assert door.woken()
    assert not door.woken()  # a wake-up is heard once
    assert not door.wait(0)


def test_a_message_that_does_not_fit_wakes_the_feeder_when_room_is_freed() -> None:
    door = Door(2)
    _lines(door, 2)
    door.ask(["a"])
    freed = threading.Timer(0.05, door.let_go, args=(door.held_ids()[:1],))
    freed.start()
    # Woken by the release, not by the end of its wait (which looks again, and finds room).
    started = time.monotonic()
    assert door.wait(60)
    assert time.monotonic() - started < 30
    freed.join()
    assert _claim_all(door) == ["a"]


def test_a_message_larger_than_the_door_gets_in_when_nothing_is_held() -> None:
    door = Door(4)
    ids = [f"job-{i}" for i in range(16)]
    door.ask(ids)
    assert _claim_all(door) == ids
    assert door.reserve(1) == 0


def test_single_jobs_have_room_of_their_own_past_a_full_door() -> None:
    door = Door(2, single_extra=1)
    _lines(door, 2)
    door.ask(["a"])
    door.ask(["b"])
    assert _claim_all(door) == ["a"]
    assert door.asked_ids() == ["b"]


def test_messages_are_claimed_in_the_order_they_came_and_together() -> None:
    door = Door(3)
    for name in ("a", "b", "c", "d"):
        door.ask([name])
    assert _claim_all(door) == ["a", "b", "c"]
    door.let_go(["b"])
    assert _claim_all(door) == ["d"]


def test_a_job_in_two_messages_has_one_ticket() -> None:
    door = Door(4)
    first = door.ask(["a"])
    assert door.ask(["a"]) == first  # asked for, not claimed yet
    _claim_all(door)
    assert door.ask(["a"]) == first  # held
    assert door.take_asked() == []


def test_a_failed_claim_puts_its_messages_back_first_with_their_room() -> None:
    door = Door(8)
    ids = [f"job-{i}" for i in range(8)]  # as large as the whole door
    door.ask(ids)
    door.ask(["late"])
    taken = door.take_asked()
    assert [list(a.tickets) for a in taken] == [ids]
    door.put_back(taken)
    # Kept, that room would turn every later job away for the life of the process.
    assert door.has_room is False  # only because messages wait
    assert _claim_all(door) == ids
    door.let_go(ids)
    assert _claim_all(door) == ["late"]


def test_jobs_not_claimed_end_their_tickets_and_a_cancelled_one_is_not_held() -> None:
    door = Door(4)
    a, b, c = door.ask(["a", "b", "c"])
    taken = door.take_asked()
    door.cancel(["c"])  # heard before the claim that got it returned
    to_run, cancelled = door.hold([_job("a"), _job("c")], taken=taken)
    assert [job.id for job in to_run] == ["a"]
    assert cancelled == ["c"]
    assert door.held_ids() == ["a"]
    assert not a.ended
    assert b.ended
    assert not b.returned
    assert c.ended
    assert not c.returned


def test_closing_turns_messages_away_and_takes_nothing_more() -> None:
    door = Door(1)
    door.ask(["a"])
    _claim_all(door)
    (waiting,) = door.ask(["b"])
    assert door.close() == ["b"]
    assert waiting.ended
    assert waiting.returned
    (late,) = door.ask(["c"])
    assert late.ended
    assert late.returned
    door.let_go(["a"])
    assert door.take_asked() == []
    assert door.reserve(1) == 0
    assert not door.wait(0.01, room_for=1)


def test_room_is_there_while_open_unheld_and_unasked_for() -> None:
    door = Door(2)
    assert door.has_room
    _lines(door, 2)
    assert not door.has_room
    door.let_go(door.held_ids())
    assert door.has_room
    door.ask(["a", "b", "c"])
    taken = door.take_asked()
    assert not door.has_room
    door.put_back(taken)
    door.close()  # a draining worker takes nothing more: it has no room to be stuck with
    assert not door.has_room
