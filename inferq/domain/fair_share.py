"""Who gets the engine's room for batch work next: weighted fair queuing between tenants.

Single jobs never wait for this: they go first. The room left for batch lines is shared
between the tenants with lines waiting in proportion to their weights (a tenant's is the
largest of its live API keys', 1 by default): each line claimed for a tenant, and each
of its flex single jobs (`service_tier: flex`), adds 1 / weight to its virtual finish time,
and the next line goes to the earliest. A tenant that had nothing waiting joins at the
queue's clock, so time away earns no credit. Within a tenant: `priority` (lower first),
then the window that closes first, then age; a batch's lines in input order. Between the
workers of one queue, none claims more than its share of the lines left (`FleetShare`)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, kw_only=True)
class FleetShare:
    """The workers claiming one queue's batch lines (this one included), and the lines
    this one holds already, by batch."""

    workers: int = 1
    held: Mapping[str, int] = field(default_factory=dict)

    def most(self, waiting: Sequence[WaitingBatch]) -> int:
        """The most lines this worker may claim of `waiting`: its share of their lines
        not yet ended (rounded up), less those of theirs it holds."""
        left = sum(batch.unfinished for batch in waiting)
        mine = sum(self.held.get(batch.id, 0) for batch in waiting)
        return -(-left // max(1, self.workers)) - mine


# A worker alone on its queue: it may take every line left.
ALONE = FleetShare()


def batch_order(
    *, priority: int, expires_at: datetime, created_at: datetime, batch_id: str
) -> tuple[int, datetime, datetime, str]:
    """A batch's place among its tenant's batches: priority, window's end, age."""
    return (priority, expires_at, created_at, batch_id)


@dataclass(frozen=True, kw_only=True)
class WaitingBatch:
    """A batch with lines waiting to be claimed, and its tenant's weight."""

    id: str
    tenant: str
    weight: float
    priority: int
    expires_at: datetime
    created_at: datetime
    # Lines not yet ended, queued or running (on any worker).
    unfinished: int = 0

    @property
    def order(self) -> tuple[int, datetime, datetime, str]:
        return batch_order(
            priority=self.priority,
            expires_at=self.expires_at,
            created_at=self.created_at,
            batch_id=self.id,
        )


@dataclass(frozen=True)
class Share:
    """A tenant's weight, and the virtual time its claimed lines finish at."""

    weight: float
    finish: float


def joined(finish: float | None, clock: float) -> float:
    """A tenant's finish time as it competes now: no earlier than the queue's clock."""
    return clock if finish is None else max(finish, clock)


def split(shares: Mapping[str, Share], lines: int) -> dict[str, int]:
    """How many of `lines` each tenant gets: one at a time to the earliest finish time
    (ties to the tenant named first, so the split is the same wherever it is made)."""
    heap = [(share.finish, tenant) for tenant, share in shares.items()]
    heapq.heapify(heap)
    counts: dict[str, int] = {}
    for _ in range(lines if heap else 0):
        finish, tenant = heapq.heappop(heap)
        counts[tenant] = counts.get(tenant, 0) + 1
        heapq.heappush(heap, (finish + 1 / shares[tenant].weight, tenant))
    return counts
