"""What a GPU worker's peers took while it took nothing: work that was its to share.

A worker whose consumers were cancelled takes no message; while its peers keep the queue
empty, the queue shows nothing waiting, and the stall watch (inferq/host/stall.py) would
never call it stuck, leaving its GPU idle. Every heartbeat says how many messages its
worker has taken: the messages its peers (same model and runner) took since this worker
last took one count as work that waited for it.
"""

from __future__ import annotations

from inferq.broker.worker_registry import WorkerRegistry


class PeerBacklog:
    """Counts, from the heartbeats, what a worker's peers took since it last took work."""

    def __init__(self, registry: WorkerRegistry, *, name: str, model: str, runner: str) -> None:
        self._registry = registry
        self._name = name
        self._model = model
        self._runner = runner
        self._taken: int | None = None
        self._since: dict[str, int] = {}  # each peer's count when this one last took work

    def __call__(self, taken: int) -> int:
        """Messages its peers took since this worker's count was last seen to move
        (`taken`: its count now). Raises `BrokerUnavailable` if Redis cannot be read."""
        peers = {
            status.name: status.taken
            for status in self._registry.online()
            if status.name != self._name
            and status.model == self._model
            and status.runner == self._runner
        }
        if taken != self._taken:  # it took work: count from here
            self._taken, self._since = taken, peers
            return 0
        for name, count in peers.items():
            # A peer first seen counts from now; one that restarted counts from zero.
            if self._since.setdefault(name, count) > count:
                self._since[name] = 0
        return sum(count - self._since[name] for name, count in peers.items())
