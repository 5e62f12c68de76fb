"""The stall watches of the housekeeper and of beat (inferq/host/stall.py).

- The housekeeper is stuck when its queues (webhooks, maintenance) hold messages,
  one of its threads is free, and it has started no task for `stall_s`: it consumes
  again through Celery's remote control, then exits if that did not help.
- Beat is stuck when it has sent no maintenance for `stall_s` (at least two of its
  intervals): it exits, to be restarted.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery import Celery
from celery.signals import after_task_publish, task_postrun, task_prerun

from inferq.broker.celery_app import consume_again
from inferq.broker.queues import QueueMonitor
from inferq.constants import MAINTAIN_TASK, SERVICE_QUEUES
from inferq.host.stall import EXIT_STUCK, Progress, StallWatch

log = logging.getLogger(__name__)


class TaskCounts:
    """Tasks this process has started, and those running now (Celery's signals)."""

    def __init__(self) -> None:
        self.started = 0
        self.running = 0
        self._lock = threading.Lock()
        task_prerun.connect(self._began, weak=False)
        task_postrun.connect(self._ended, weak=False)

    def _began(self, **_: Any) -> None:
        with self._lock:
            self.started += 1
            self.running += 1

    def _ended(self, **_: Any) -> None:
        with self._lock:
            self.running -= 1


def housekeeper_watch(
    *, celery: Celery, monitor: QueueMonitor, node: str, threads: int, stall_s: float
) -> StallWatch:
    counts = TaskCounts()

    def read() -> Progress:
        waiting = sum(monitor.depth(queue) for queue in SERVICE_QUEUES)
        return Progress(taken=counts.started, room=counts.running < threads, waiting=waiting)

    return StallWatch(
        name=f"housekeeper {node}",
        stall_s=stall_s,
        read=read,
        heal=lambda: consume_again(celery, node=node, queues=SERVICE_QUEUES),
        give_up=_exit,
    )


def beat_watch(*, stall_s: float) -> StallWatch:
    sent = [0]

    def count(sender: str | None = None, **_: Any) -> None:
        if sender == MAINTAIN_TASK:
            sent[0] += 1

    after_task_publish.connect(count, weak=False)
    return StallWatch(
        name="beat",
        stall_s=stall_s,
        # Maintenance is always due: a reading with work waiting and room to send it.
        read=lambda: Progress(taken=sent[0], room=True, waiting=1),
        heal=lambda: False,
        give_up=_exit,
    )


def _exit(why: str) -> None:
    log.critical("exiting (%d) to be restarted: %s", EXIT_STUCK, why)
    logging.shutdown()
    os._exit(EXIT_STUCK)
