"""Sends streamed jobs' tokens to Redis from a thread of its own, so the engine loop
never waits on the network.

The loop hands over events without blocking; this thread takes everything that has
come since its last write, merges each job's deltas (`inferq.broker.token_stream.coalesce`) and
writes them in one round trip. Under load a write carries many steps; when it is quiet
each step goes out as soon as it is made.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Sequence

from inferq.broker.token_stream import TokenEvent, TokenStreamWriter, coalesce
from inferq.host import supervision

log = logging.getLogger(__name__)

# Most events taken into one write.
MAX_EVENTS = 4096


class TokenPublisher(supervision.SupervisedThread):
    """A queue of token events and the thread that writes them; `stop` writes what is
    queued, then ends it."""

    thread_name = "token-publisher"

    def __init__(self, writer: TokenStreamWriter) -> None:
        self._writer = writer
        self._queue: queue.SimpleQueue[Sequence[TokenEvent] | None] = queue.SimpleQueue()
        super().__init__()

    def put(self, events: Sequence[TokenEvent]) -> None:
        """Queue events for writing; never blocks."""
        self._queue.put(events)

    def _wake(self) -> None:
        self._queue.put(None)  # after everything queued before it

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            events = list(first)
            while len(events) < MAX_EVENTS:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    stopping = True
                    break
                events.extend(more)
            try:
                self._writer.write(coalesce(events))
            except Exception:  # the thread must live on: readers fall back to Postgres
                log.exception("writing %d token events failed", len(events))
