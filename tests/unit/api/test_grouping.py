import asyncio
import threading
from collections.abc import Sequence

import pytest

from api.grouping import Grouped


class Recorder:
    """A handler that records the groups it saw; it blocks until released, so that the
    test controls when a group ends."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.release = threading.Event()

    def __call__(self, items: Sequence[int]) -> list[int | BaseException]:
        self.groups.append(list(items))
        self.release.wait(5)
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


async def _started(recorder: Recorder, count: int) -> None:
    while len(recorder.groups) < count:
        await asyncio.sleep(0.001)


def test_requests_that_arrive_while_a_group_runs_form_the_next_group() -> None:
    async def scenario() -> tuple[list[object], list[list[int]]]:
        recorder = Recorder()
        grouped: Grouped[int, int] = Grouped(recorder, max_items=3)
        first = asyncio.ensure_future(grouped(0))
        await _started(recorder, 1)  # the first goes alone, at once
        rest = [asyncio.ensure_future(grouped(i)) for i in range(2, 10, 2)]
        recorder.release.set()
        results = await asyncio.gather(first, *rest, return_exceptions=True)
        return list(results), recorder.groups

    results, groups = asyncio.run(scenario())
    assert results == [0, 20, 40, 60, 80]
    assert groups == [[0], [2, 4, 6], [8]]


def test_each_request_gets_its_own_error_and_a_failed_group_fails_every_request() -> None:
    def broken(items: Sequence[int]) -> list[int | BaseException]:
        raise RuntimeError("database down")

    async def scenario() -> None:
        recorder = Recorder()
        recorder.release.set()
        grouped: Grouped[int, int] = Grouped(recorder, max_items=10)
        with pytest.raises(ValueError, match="odd 3"):
            await grouped(3)
        assert await grouped(4) == 40
        failing: Grouped[int, int] = Grouped(broken, max_items=10)
        outcomes = await asyncio.gather(failing(1), failing(2), return_exceptions=True)
        assert all(isinstance(o, RuntimeError) for o in outcomes)

    asyncio.run(scenario())
