"""Batch estimates made and kept up to date: when a batch is created (the API), before one
is (`POST /v1/batch-estimates`), and every maintenance pass while batches run (the
housekeeper). The arithmetic is `inferq.domain.estimates`."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from datetime import datetime

from inferq.domain.estimates import BatchWork, Estimate, ModelSpeed, estimate
from inferq.domain.served_models import ServedModel
from inferq.store.base import utcnow
from inferq.store.batch_work import BatchWorkStore, ModelWork
from inferq.store.engine_speeds import SpeedStore
from inferq.wire.model_catalog import ModelSource

# The rows of workers silent this long go (the newest of each model stays).
FORGET_WORKERS_AFTER_S = 7 * 86400
# A batch read between maintenance passes is estimated again from its progress so far,
# at most this often (per API process), and only so many batches are remembered.
FOLLOW_S = 2.0
FOLLOWED_KEPT = 10_000


class BatchEstimates:
    def __init__(
        self,
        *,
        work: BatchWorkStore,
        speeds: SpeedStore,
        models: ModelSource,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self._work = work
        self._speeds = speeds
        self._models = models
        self._clock = clock
        self._followed: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    def follow(self, batch_id: str) -> bool:
        """Estimate a batch in progress again, from its lines ended so far, if that was
        not done in the last `FOLLOW_S` here (a client polling it sees its progress, not
        the last maintenance pass's view of it). True if it was."""
        now = time.monotonic()
        with self._lock:
            last = self._followed.get(batch_id)
            if last is not None and now - last < FOLLOW_S:
                return False
            self._followed[batch_id] = now
            self._followed.move_to_end(batch_id)
            while len(self._followed) > FOLLOWED_KEPT:
                self._followed.popitem(last=False)
        self.refresh(only=batch_id)
        return True

    def refresh(self, *, only: str | None = None) -> dict[str, Estimate | None]:
        """Estimate the batches in progress again (or just `only`) and keep what comes
        out with them; returns it."""
        running = self._work.in_progress()
        served = {model.name: model for model in self._models.all()}
        by_base: defaultdict[str, list[ModelWork]] = defaultdict(list)
        for item in running:
            if (model := _served(item, served)) is not None:
                by_base[model.base].append(item)
        now = self._clock()
        made: dict[str, Estimate | None] = {}
        for base, items in by_base.items():
            if only is not None and only not in {i.work.batch_id for i in items}:
                continue
            speed = ModelSpeed.of(self._speeds.of_model(base), now=now)
            runner = served[base].runner if base in served else "generate"
            works = [item.work for item in items]
            for item in items:
                if only is None or item.work.batch_id == only:
                    made[item.work.batch_id] = estimate(
                        item.work, others=works, speed=speed, runner=runner, now=now
                    )
        self._work.save_estimates(made)
        return made

    def of_new(self, work: BatchWork, *, model: str) -> Estimate | None:
        """The estimate of a batch not created yet: sharing the engine with every batch
        in progress, after those of its own tenant."""
        served = {served.name: served for served in self._models.all()}
        info = served.get(model)
        if info is None:
            return None
        others = [
            item.work
            for item in self._work.in_progress()
            if (other := _served(item, served)) is not None and other.base == info.base
        ]
        now = self._clock()
        speed = ModelSpeed.of(self._speeds.of_model(info.base), now=now)
        base = served.get(info.base, info)
        work = dataclasses.replace(work, weight=self._work.tenant_weight(work.tenant))
        return estimate(work, others=others, speed=speed, runner=base.runner, now=now)

    def forget_gone_workers(self) -> int:
        return self._speeds.forget_gone(after_s=FORGET_WORKERS_AFTER_S)


def _served(item: ModelWork, served: dict[str, ServedModel]) -> ServedModel | None:
    return None if item.model is None else served.get(item.model)
