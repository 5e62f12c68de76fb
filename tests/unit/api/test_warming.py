"""The API loads the tokenizers of models registered after it started, before their first
request: a fresh deployment's API starts before its workers announce their models."""

from __future__ import annotations

import asyncio

import pytest

import api.main
from inferq.exceptions import StoreUnavailable


class Catalog:
    """Counts the passes; the first fails as when Postgres is away."""

    def __init__(self, wanted: int) -> None:
        self.passes = 0
        self.wanted = wanted
        self.done = asyncio.Event()

    def warm(self) -> None:
        self.passes += 1
        if self.passes >= self.wanted:
            self.done.set()
        if self.passes == 1:
            raise StoreUnavailable("the database is unavailable")


def test_the_api_looks_for_new_models_again_and_again_even_after_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(api.main, "REFRESH_S", 0.01)

    async def run() -> int:
        catalog = Catalog(wanted=3)
        task = asyncio.create_task(api.main._keep_warm(catalog))  # type: ignore[arg-type]
        await asyncio.wait_for(catalog.done.wait(), timeout=10)
        task.cancel()
        return catalog.passes

    assert asyncio.run(run()) >= 3
