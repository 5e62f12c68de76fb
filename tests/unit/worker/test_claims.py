"""Room at the gate survives a claim that fails."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from inferq.domain.jobs import ClaimedJob
from tests.helpers.fakes import MemoryJobStore
from worker.capacity import CapacityGate
from worker.claims import Claimer


class FailingClaims(MemoryJobStore):
    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def claim_jobs(self, job_ids: Sequence[str], *, worker: str, lease_s: int) -> list[ClaimedJob]:
        raise self.error


def _claimer(store: MemoryJobStore, gate: CapacityGate) -> Claimer:
    return Claimer(store=store, gate=gate, worker_name="w", lease_s=60, requeue_after_s=3600)


def test_a_claim_that_raises_gives_back_the_room_it_took() -> None:
    gate = CapacityGate(8)
    ids = [f"job-{i}" for i in range(8)]  # as large as the whole gate
    with pytest.raises(RuntimeError, match="a bug"):
        _claimer(FailingClaims(RuntimeError("a bug")), gate).take(ids)
    assert gate.has_room
    # Kept, that room would turn every later job away for the life of the process.
    assert gate.acquire(8, timeout_s=0)
