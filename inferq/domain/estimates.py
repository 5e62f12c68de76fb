"""When a batch will end, and what it will cost in tokens: plain data and the arithmetic.

`estimate` takes the model's workers' measured rates (`EngineSpeed`, `ModelSpeed`) and the
work of every batch of the model in progress (`BatchWork`), and returns an `Estimate`:
the batch's expected end, with an interval from `RATE_SHARE` either way on the rate to
every remaining line running to its `max_tokens`. Work is counted in the tokens the
engine makes; tenants share the rate by weight as their lines are claimed
(inferq/domain/fair_share.py) and single jobs' recent rate comes first. How the
estimate is made, in a user's words: docs/guide/batches.md."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from inferq.domain.fair_share import batch_order

# A worker that has not reported for this long is not counted (it reports every
# `HEARTBEAT_EVERY_S`).
LIVE_S = 60
# Until this share of a batch's lines have ended, its expected output leans on what the
# model's workers measured; from then on, on what its own lines generated.
OWN_SHARE = 0.05
# The model's workers have measured nothing yet: every line is expected to run to its
# `max_tokens` (the cost's upper bound, so the estimate errs late, not early).
UNMEASURED_FRACTION = 1.0
# Single jobs never take more than this share of the rate from a batch in an estimate:
# however many single jobs run, batch lines get the slots the engine keeps for them.
MAX_SINGLE_JOB_SHARE = 0.9
RATE_SHARE = 0.25
GENERATE = "generate"


@dataclass(frozen=True, kw_only=True)
class EngineSpeed:
    """What one GPU worker measured of its engine."""

    worker: str
    model: str
    runner: str
    tokens_per_s: float
    """Generation: output tokens a second with the engine at least half full. Embeddings:
    prompt tokens a second while it was busy."""
    output_fraction: float | None
    """Of the `max_tokens` of the jobs it finished, the share they generated."""
    step_s: float | None
    """How much longer a step with few sequences in the engine takes than its tokens would
    at the full rate (a batch's last lines pay it a token)."""
    interactive_tokens_per_s: float
    """What single jobs took of it over the last minute (tokens a second)."""
    reported_at: datetime
    at_load: bool = True
    """Whether `tokens_per_s` was measured with the engine at least half full (False: at
    whatever load it had, one job's say, which is no measure of a batch's rate)."""


@dataclass(frozen=True, kw_only=True)
class BatchWork:
    """A batch's work, whole and done, as its row counts it, and its place in the share."""

    batch_id: str
    created_at: datetime
    lines: int
    ended: int
    succeeded: int
    prompt_tokens: int
    """Of every line."""
    max_tokens: int
    """Every line's `max_tokens` (times its `n`), summed."""
    longest_tokens: int
    """The largest of them."""
    input_tokens: int
    """Prompt tokens of the lines that succeeded."""
    output_tokens: int
    """Tokens the lines that succeeded generated."""
    tenant: str = ""
    weight: float = 1.0
    """Its tenant's weight in the share of batch work."""
    priority: int = 0
    expires_at: datetime | None = None

    @property
    def order(self) -> tuple[int, datetime, datetime, str]:
        """Its place among its tenant's batches, as its lines are claimed."""
        return batch_order(
            priority=self.priority,
            expires_at=self.expires_at or self.created_at,
            created_at=self.created_at,
            batch_id=self.batch_id,
        )

    @property
    def remaining_lines(self) -> int:
        return max(self.lines - self.ended, 0)


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """When a batch is expected to end and the tokens it is expected to cost."""

    completion_at: datetime
    earliest_at: datetime
    latest_at: datetime
    input_tokens: int
    output_tokens: int
    """Expected, over all its lines: what ended lines generated, and the rest expected."""
    output_tokens_max: int
    """Every line at its `max_tokens`: it cannot cost more."""
    tokens_per_s: float
    """The rate it is expected to get while it runs (its tenant's share)."""
    tokens_ahead: int
    """Other batches' work expected to run before it ends (tokens)."""
    made_at: datetime

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = dataclasses.asdict(self)
        for name in _TIMES:
            data[name] = data[name].isoformat()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Estimate:
        # Estimates kept by earlier versions carry fields since dropped (a batch's pace).
        values = {name: value for name, value in data.items() if name in _FIELDS}
        for name in _TIMES:
            values[name] = datetime.fromisoformat(values[name])
        return cls(**values)


_TIMES = ("completion_at", "earliest_at", "latest_at", "made_at")
_FIELDS = frozenset(field.name for field in dataclasses.fields(Estimate))


@dataclass(frozen=True, kw_only=True)
class ModelSpeed:
    """The rate a model's workers have, from their reports."""

    tokens_per_s: float
    interactive_tokens_per_s: float
    output_fraction: float | None
    step_s: float | None
    workers: int
    at_load: bool = True
    """Whether any of the rates counted was measured with an engine at load."""

    @classmethod
    def of(cls, speeds: Sequence[EngineSpeed], *, now: datetime) -> ModelSpeed | None:
        """From the reports of a model's workers (one runner); None if there are none."""
        if not speeds:
            return None
        live = [s for s in speeds if now - s.reported_at <= timedelta(seconds=LIVE_S)]
        counted = live or [max(speeds, key=lambda s: s.reported_at)]
        fractions = [s.output_fraction for s in counted if s.output_fraction is not None]
        steps = [s.step_s for s in counted if s.step_s is not None]
        return cls(
            tokens_per_s=sum(s.tokens_per_s for s in counted),
            interactive_tokens_per_s=sum(s.interactive_tokens_per_s for s in live),
            output_fraction=sum(fractions) / len(fractions) if fractions else None,
            step_s=sum(steps) / len(steps) if steps else None,
            workers=len(live),
            at_load=any(s.at_load for s in counted),
        )

    @property
    def batch_tokens_per_s(self) -> float:
        """What batch lines get: the rate less what single jobs take."""
        single_jobs = min(self.interactive_tokens_per_s, MAX_SINGLE_JOB_SHARE * self.tokens_per_s)
        return self.tokens_per_s - single_jobs


def estimate(
    work: BatchWork,
    *,
    others: Sequence[BatchWork],
    speed: ModelSpeed | None,
    runner: str,
    now: datetime,
) -> Estimate | None:
    """When `work` ends, sharing the engine's rate at `speed` with `others` (the other
    batches of its model in progress); None while nothing has been measured at load (no
    worker of its model has run with its engine half full: a rate at lower load, one
    job's say, would put a large batch at hours where it takes minutes)."""
    if speed is None or not speed.at_load or speed.batch_tokens_per_s <= 0:
        return None
    generate = runner == GENERATE
    model_fraction = UNMEASURED_FRACTION
    if speed.output_fraction is not None:
        model_fraction = speed.output_fraction

    def left(batch: BatchWork) -> float:
        """The work a batch still holds, in the tokens the engine makes."""
        if not generate:
            return batch.prompt_tokens * batch.remaining_lines / max(batch.lines, 1)
        return _remaining_max_tokens(batch) * _fraction(batch, model_fraction=model_fraction)

    rate = speed.batch_tokens_per_s
    everyone = [work, *(o for o in others if o.batch_id != work.batch_id)]
    run = _shared_ends({b.batch_id: left(b) for b in everyone}, everyone, rate=rate)
    own = left(work)
    ends_s, own_rate = run[work.batch_id]
    tokens_ahead = max(rate * ends_s - own, 0.0)
    worst_own = _remaining_max_tokens(work) if generate else own
    # At worst every other tenant's work, and its own tenant's batches before it, go first.
    may_go_first = sum(
        left(o) for o in everyone[1:] if o.tenant != work.tenant or o.order < work.order
    )
    # Its last lines run with the engine emptying: a step a token, however few they are.
    tail_s = 0.0
    if generate and work.remaining_lines and speed.step_s is not None:
        longest = work.longest_tokens * _fraction(work, model_fraction=model_fraction)
        tail_s = longest * speed.step_s
    expected_s = ends_s + tail_s
    latest_s = (may_go_first + worst_own) / rate + work.longest_tokens * (
        speed.step_s if generate and speed.step_s is not None else 0.0
    )
    return Estimate(
        completion_at=now + timedelta(seconds=expected_s),
        earliest_at=now + timedelta(seconds=expected_s * (1 - RATE_SHARE)),
        latest_at=now + timedelta(seconds=max(latest_s, expected_s * (1 + RATE_SHARE))),
        input_tokens=work.prompt_tokens,
        output_tokens=work.output_tokens + (round(own) if generate else 0),
        output_tokens_max=work.output_tokens + round(_remaining_max_tokens(work))
        if generate
        else 0,
        tokens_per_s=round(own_rate, 3),
        tokens_ahead=round(tokens_ahead),
        made_at=now,
    )


def _shared_ends(
    left: Mapping[str, float], batches: Sequence[BatchWork], *, rate: float
) -> dict[str, tuple[float, float]]:
    """Run the sharing forward: each tenant with work gets `rate` times its weight over
    the weights of all with work, spent on its batches one after another. For each batch,
    the seconds until it ends and the rate it got while it ran."""
    queues: dict[str, list[BatchWork]] = {}
    for batch in sorted(batches, key=lambda b: b.order):
        queues.setdefault(batch.tenant, []).append(batch)
    weights = {t: max(q[0].weight, 1e-9) for t, q in queues.items()}
    remaining = dict(left)
    began: dict[str, float] = {}
    ends: dict[str, tuple[float, float]] = {}
    clock = 0.0
    while queues:
        total = sum(weights[t] for t in queues)
        shares = {t: rate * weights[t] / total for t in queues}
        for queue in queues.values():
            began.setdefault(queue[0].batch_id, clock)
        step = min(remaining[q[0].batch_id] / shares[t] for t, q in queues.items())
        clock += step
        for tenant in list(queues):
            queue = queues[tenant]
            head = queue[0].batch_id
            remaining[head] -= shares[tenant] * step
            if remaining[head] <= 1e-9 * max(left[head], 1.0):
                spent = clock - began[head]
                ends[head] = (clock, left[head] / spent if spent > 0 else shares[tenant])
                queue.pop(0)
                if not queue:
                    del queues[tenant]
    return ends


def _remaining_max_tokens(batch: BatchWork) -> float:
    return batch.max_tokens * batch.remaining_lines / max(batch.lines, 1)


def _fraction(batch: BatchWork, *, model_fraction: float) -> float:
    """The share of `max_tokens` the batch's remaining lines are expected to generate:
    the model's, moving to the batch's own as its lines succeed. Its ended lines are its
    shortest so far: a share above the model's counts fully once `OWN_SHARE` of the
    lines have ended; one below it only by the share of the lines ended."""
    if batch.succeeded == 0 or batch.max_tokens == 0:
        return model_fraction
    own = min(batch.output_tokens / (batch.max_tokens * batch.succeeded / batch.lines), 1.0)
    if own >= model_fraction:
        weight = min(1.0, batch.succeeded / max(OWN_SHARE * batch.lines, 1))
    else:
        weight = batch.ended / max(batch.lines, 1)
    return weight * own + (1 - weight) * model_fraction
