"""The token publisher: events handed over never wait on a write; what came during a
write goes out in the next one, each job's deltas merged in order; a failed write loses
only its own events; `stop` writes what is queued first."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from inferq.broker.token_stream import ChoiceDelta, JobDelta, RunStarted, TokenEvent
from tests.helpers.fakes import KeptTokens
from worker.token_publisher import TokenPublisher

WAIT_S = 10


def _delta(job_id: str, text: str, offset: int) -> JobDelta:
    return JobDelta(
        job_id=job_id,
        choices=(ChoiceDelta(index=0, text=text, offset=offset, tokens=len(text)),),
    )


def _texts(events: list[TokenEvent]) -> list[tuple[str, str]]:
    """(job, text) per delta, ("job", "start") per start, in order."""
    return [
        (e.job_id, e.choices[0].text) if isinstance(e, JobDelta) else (e.job_id, "start")
        for e in events
    ]


@pytest.fixture
def kept() -> KeptTokens:
    return KeptTokens()


@pytest.fixture
def publisher(kept: KeptTokens) -> Iterator[TokenPublisher]:
    publisher = TokenPublisher(kept)  # type: ignore[arg-type]
    publisher.start()
    yield publisher
    kept.go.set()
    publisher.stop()
    assert not [t for t in threading.enumerate() if t.name == "token-publisher"]


def test_what_comes_during_a_write_goes_out_in_the_next_each_jobs_deltas_merged(
    kept: KeptTokens, publisher: TokenPublisher
) -> None:
    kept.hold()
    publisher.put([_delta("a", "x", 0)])
    assert kept.writing.wait(WAIT_S)
    # The write is under way and held: these are queued, and put never waits.
    publisher.put([RunStarted(job_id="b"), _delta("a", "y", 1)])
    publisher.put([_delta("b", "p", 0), _delta("a", "z", 2)])
    publisher.put([_delta("b", "q", 1)])
    kept.go.set()
    assert kept.wait_for(lambda: len(kept.writes) == 2, WAIT_S)
    first, second = kept.writes
    assert _texts(first) == [("a", "x")]
    assert _texts(second) == [("b", "start"), ("a", "yz"), ("b", "pq")]
    [merged] = [e for e in second if isinstance(e, JobDelta) and e.job_id == "a"]
    assert merged.choices[0].offset == 1
    assert merged.choices[0].tokens == 2


def test_a_failed_write_loses_only_its_events_and_the_thread_lives_on(
    kept: KeptTokens, publisher: TokenPublisher
) -> None:
    kept.fail()
    kept.hold()
    publisher.put([_delta("a", "lost", 0)])
    assert kept.writing.wait(WAIT_S)
    publisher.put([_delta("a", "kept", 4)])
    kept.go.set()
    assert kept.wait_for(lambda: len(kept.writes) == 1, WAIT_S)
    assert _texts(kept.writes[0]) == [("a", "kept")]


def test_stop_writes_everything_queued_before_it_ends(kept: KeptTokens) -> None:
    publisher = TokenPublisher(kept)  # type: ignore[arg-type]
    kept.hold()
    publisher.start()
    publisher.put([_delta("a", "x", 0)])
    assert kept.writing.wait(WAIT_S)
    publisher.put([_delta("a", "y", 1)])
    publisher.put([_delta("b", "z", 0)])
    kept.go.set()
    publisher.stop()
    assert [_texts(write) for write in kept.writes] == [[("a", "x")], [("a", "y"), ("b", "z")]]
    assert not [t for t in threading.enumerate() if t.name == "token-publisher"]
