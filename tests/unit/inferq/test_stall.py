"""The stall watch's rule, read against a clock the test moves."""

from __future__ import annotations

from inferq.exceptions import BrokerUnavailable
from inferq.host.stall import Progress, StallWatch

STALL_S = 60.0


class Watched:
    """A process whose readings, healing and giving up the test controls."""

    def __init__(self, *, heals: bool = True) -> None:
        self.now = 0.0
        self.reading: Progress | Exception = Progress(taken=0, room=True, waiting=5)
        self.heals = heals
        self.healed = 0
        self.gave_up: list[str] = []
        self.watch = StallWatch(
            name="worker",
            stall_s=STALL_S,
            read=self.read,
            heal=self.heal,
            give_up=self.gave_up.append,
            clock=lambda: self.now,
        )

    def read(self) -> Progress:
        if isinstance(self.reading, Exception):
            raise self.reading
        return self.reading

    def heal(self) -> bool:
        self.healed += 1
        return self.heals

    def at(self, now: float) -> None:
        self.now = now
        self.watch.check()


def test_room_and_waiting_work_with_nothing_taken_for_the_bound_is_stuck_and_heals() -> None:
    watched = Watched()
    for now in (0, 10, 59):
        watched.at(now)
    assert watched.watch.stuck is None
    watched.at(61)
    assert watched.watch.stuck is not None
    assert "5 waiting" in watched.watch.stuck
    assert watched.healed == 1
    assert watched.gave_up == []
    # Healing worked: work is taken again.
    watched.reading = Progress(taken=3, room=True, waiting=2)
    watched.at(65)
    assert watched.watch.stuck is None


def test_still_stuck_a_bound_after_healing_gives_up() -> None:
    watched = Watched()
    watched.at(0)
    watched.at(61)
    watched.at(100)
    assert watched.gave_up == []
    watched.at(122)
    assert watched.healed == 1
    assert len(watched.gave_up) == 1


def test_healing_that_fails_gives_up_at_once() -> None:
    watched = Watched(heals=False)
    watched.at(0)
    watched.at(61)
    assert watched.healed == 1
    assert len(watched.gave_up) == 1


def test_a_full_or_idle_process_is_never_stuck() -> None:
    watched = Watched()
    watched.at(0)
    watched.reading = Progress(taken=0, room=False, waiting=5)  # busy: no room
    watched.at(61)
    watched.reading = Progress(taken=0, room=True, waiting=0)  # nothing waits
    watched.at(122)
    watched.reading = Progress(taken=0, room=True, waiting=5)
    watched.at(130)
    watched.at(189)
    assert watched.watch.stuck is None
    assert watched.healed == 0


def test_taking_work_restarts_the_bound() -> None:
    watched = Watched()
    watched.at(0)
    watched.reading = Progress(taken=1, room=True, waiting=5)
    watched.at(50)
    watched.at(100)
    assert watched.watch.stuck is None
    watched.at(111)
    assert watched.watch.stuck is not None


def test_a_reading_that_fails_tells_nothing() -> None:
    watched = Watched()
    watched.at(0)
    watched.reading = BrokerUnavailable("Redis is away")
    watched.at(30)
    watched.reading = Progress(taken=0, room=True, waiting=5)
    watched.at(61)
    watched.at(120)
    assert watched.watch.stuck is None  # the bound began again after the gap
    watched.at(122)
    assert watched.watch.stuck is not None


def test_work_taken_elsewhere_ends_being_stuck() -> None:
    watched = Watched()
    watched.at(0)
    watched.at(61)
    assert watched.watch.stuck is not None
    watched.reading = Progress(taken=0, room=True, waiting=0)  # another worker took it
    watched.at(65)
    assert watched.watch.stuck is None
    watched.reading = Progress(taken=0, room=True, waiting=5)
    watched.at(70)
    watched.at(131)
    assert watched.healed == 2  # a new stall heals first again
    assert watched.gave_up == []


def test_work_its_peers_took_while_it_took_none_makes_it_stuck_and_is_said() -> None:
    # Its peers keep the queue empty: what they took counts as what waited for it.
    watched = Watched()
    watched.reading = Progress(taken=0, room=True, waiting=12, taken_by_peers=12)
    for now in (0, 30, 61):
        watched.at(now)
    assert watched.watch.stuck is not None
    assert "12 waiting (12 of them taken by its peers meanwhile)" in watched.watch.stuck
    assert watched.healed == 1
