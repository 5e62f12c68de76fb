"""The chaos run's bound on waiting: "nothing waits forever", measured. After a process
stops taking work (its consumers cancelled, a thread of it dead), how long until it takes
work again, and how long any job waited to start.

`BOUND_S` = 2 x `STALL_S` + `WORKER_START_S`: a process that takes nothing while work waits
for it is noticed within a stall bound (and one reading), heals or gives up within a
second, and one that exited is started again and loads its model (`WORKER_START_S` on a
two-core host under the run's load).

**Heal times**, for each `cancel_consumers` and `thread_death` that fired: from the fault
to the first line after it in its target's log that says the process takes work again:
"is taking work again" (its stall watch consumed again) or Celery's " ready." (a process
started again in its place consumes). A cancelled process takes nothing until work waits
for it (while the other worker keeps up, none does), so its heal time can be long with
nothing kept waiting; what compares with the bound is its **stall**: from when work first
waited for it with room to take it (its "is stuck" line says for how long) until it took
work again; for a thread death, from the fault until the worker started in its place was
ready. Both are reported, with the longest stall; neither fails a run by itself (a restart
slower than the bound while the other worker serves keeps no job waiting). A cancelled
process that never said "is stuck" is reported as not stuck (and may still be cancelled
at the end). One that said "is stuck" after the fault and never took work again after
that is **unhealed** (a failing finding).

**Waits**, of single jobs (not batch lines, not poison requests) that started: from their
creation to the start of the run that ended them. Each is put down to a fault:
- excused, to an older kind of fault whose span it overlaps: from the fault's beginning
  to `AFTER_S[kind]` after its end. Each has its own way back and its own delay (leases
  lapse, lost messages are published again, an engine starts again), not bounded here;
- else judged, against the `cancel_consumers` or `thread_death` that fired before the job
  started after which it waited longest (the latest before its creation, or else the
  first while it waited): the part of its wait after that fault began must be within
  `BOUND_S`, or the job **waited past the bound** (a failing finding);
- else (no such fault before it) reported as the load's own queueing.
Batch lines are left out: a line waits its turn behind its own batch's earlier lines by
design, minutes for a large batch; that every batch ends is the checker's. An unexpected
exit (the fault log's `exited`) excuses nothing.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from bench.chaos.cluster import LEASE_S, POISON_SEED, REQUEUE_AFTER_S, STALL_S

# A GPU worker's start, from its process to consuming, with the tiny model on vLLM's CPU
# backend while the run's load and the other worker share the two cores.
WORKER_START_S = 120.0
BOUND_S = 2 * STALL_S + WORKER_START_S
JUDGED = ("cancel_consumers", "thread_death")
# Leeway after an older fault for what follows it by design: a maintenance pass, a
# client's retry, a worker's reconnect.
MARGIN_S = 30.0
AFTER_S = {
    # A dead or frozen worker's jobs come back when their leases lapse.
    "kill_worker": LEASE_S + MARGIN_S,
    "stop_worker": LEASE_S + MARGIN_S,
    "kill_api": MARGIN_S,
    # Messages lost with Redis's data: their jobs are published again after this.
    "restart_redis": REQUEUE_AFTER_S + MARGIN_S,
    "restart_postgres": MARGIN_S,
    # Down a minute: nothing requeued or republished meanwhile.
    "kill_housekeeper": REQUEUE_AFTER_S + MARGIN_S,
    "kill_beat": REQUEUE_AFTER_S + MARGIN_S,
    # The engine core dies at each of its tries: the worker starts its engine again, twice.
    "poison": 2 * WORKER_START_S,
    "drop_receiver": 0.0,
}
HEALED = ("is taking work again", " ready.")
RECOVERED = (*HEALED, "is not stuck again")
STUCK = "is stuck: "
GAVE_UP = "healing did not help"
THREAD_DIED = "died of an unexpected error"
_WORDS = (*RECOVERED, STUCK, GAVE_UP, THREAD_DIED)
# The stall watch's line: "... and nothing taken for 31 s; healing".
_STUCK_FOR = re.compile(r"nothing taken for (\d+) s")
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


@dataclass(frozen=True)
class Line:
    at: float  # seconds since the epoch
    text: str


def waits_after_faults(
    *, faults: Sequence[dict[str, Any]], database_url: str, logs: Path
) -> dict[str, Any]:
    """Heal times and waits by fault, and the findings (`waited_past_bound`, `unhealed`)."""
    judged = [f for f in faults if f["kind"] in JUDGED and f.get("fired")]
    lines = {path.stem: _lines(path) for path in logs.glob("*.log")}
    heals = [_heal(fault, lines.get(fault["target"], [])) for fault in judged]
    found: dict[str, list[str]] = {"waited_past_bound": [], "unhealed": []}
    for heal in heals:
        if heal["how"] == "unhealed":
            found["unhealed"].append(
                f"{heal['target']} stuck since {heal['stuck_after_s']:.0f} s after "
                f"{heal['kind']} and never took work again"
            )
    waits = _waits(_started_jobs(database_url), faults, judged, heals, found)
    stalled = [h["stalled_s"] for h in heals if h["stalled_s"] is not None]
    return {
        "bound_s": BOUND_S,
        "stall_s": STALL_S,
        "heals": heals,
        "longest_stall_s": max(stalled, default=None),
        "waits": waits,
        "stalls": _stalls(lines),
        "findings": found,
    }


def _lines(path: Path) -> list[Line]:
    """The log's lines that inferq's logging stamped (not vLLM's, nor tracebacks)."""
    found = []
    for text in path.read_text(errors="replace").splitlines():
        if not any(word in text for word in _WORDS):
            continue  # Celery's line for each task, mostly: an hour's run has many
        if match := _STAMP.match(text):
            # Local time, as logged, on the run's own host.
            stamp = datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S,%f")
            found.append(Line(stamp.timestamp(), text))
    return found


def _heal(fault: dict[str, Any], lines: Sequence[Line]) -> dict[str, Any]:
    after = [line for line in lines if line.at >= fault["began"]]
    healed = next((line for line in after if any(s in line.text for s in HEALED)), None)
    # Its own stall, not a later fault's.
    until = math.inf if healed is None else healed.at
    stuck = next((line for line in after if STUCK in line.text and line.at <= until), None)
    last_stuck = next((line for line in reversed(after) if STUCK in line.text), None)
    unhealed = last_stuck is not None and not any(
        any(s in line.text for s in RECOVERED) for line in after if line.at >= last_stuck.at
    )
    if unhealed:
        how = "unhealed"
    elif healed is None:
        how = "not stuck"
    elif "ready." in healed.text:
        how = "started again"
    else:
        how = "consumed again"
    return {
        "kind": fault["kind"],
        "target": fault["target"],
        "began": fault["began"],
        "how": how,
        "stuck_after_s": None if stuck is None else stuck.at - fault["began"],
        "healed_after_s": None if healed is None else healed.at - fault["began"],
        "stalled_s": _stalled_s(fault, stuck, healed),
        "exit_code": fault.get("exit_code"),
    }


def _stalled_s(fault: dict[str, Any], stuck: Line | None, healed: Line | None) -> float | None:
    """How long work waited for the process before it took work again."""
    if healed is None:
        return None
    if fault["kind"] == "thread_death":
        return healed.at - fault["began"]  # dead from the fault until started again
    if stuck is None:
        return None
    since = _STUCK_FOR.search(stuck.text)
    waited_s = float(since[1]) if since else 0.0
    return healed.at - stuck.at + waited_s


def _started_jobs(database_url: str) -> list[tuple[str, float, float]]:
    """Single jobs that started: id, created and started (epoch seconds)."""
    with psycopg.connect(database_url.replace("+psycopg", "")) as conn:
        rows = conn.execute(
            "SELECT id, extract(epoch FROM created_at)::float8, "
            "extract(epoch FROM started_at)::float8 FROM jobs "
            "WHERE batch_id IS NULL AND started_at IS NOT NULL "
            "AND (sampling->>'seed') IS DISTINCT FROM %s",
            (str(POISON_SEED),),
        ).fetchall()
    return [(row[0], row[1], row[2]) for row in rows]


def _waits(
    jobs: Sequence[tuple[str, float, float]],
    faults: Sequence[dict[str, Any]],
    judged: Sequence[dict[str, Any]],
    heals: list[dict[str, Any]],
    found: dict[str, list[str]],
) -> dict[str, Any]:
    older = [f for f in faults if f["kind"] in AFTER_S]
    excused: defaultdict[str, list[float]] = defaultdict(list)
    by_heal: defaultdict[int, list[float]] = defaultdict(list)
    before_any: list[float] = []
    for job_id, created, started in jobs:
        if excuse := _excuse(older, created, started):
            excused[excuse].append(started - created)
            continue
        index = _fault_of(judged, created, started)
        if index is None:
            before_any.append(started - created)
            continue
        waited_s = started - max(created, judged[index]["began"])
        by_heal[index].append(waited_s)
        if waited_s > BOUND_S:
            fault = judged[index]
            found["waited_past_bound"].append(
                f"job {job_id} waited {waited_s:.0f} s after {fault['kind']} on {fault['target']}"
            )
    for index, heal in enumerate(heals):
        heal["jobs"] = len(by_heal[index])
        heal["longest_wait_s"] = max(by_heal[index], default=None)
    judged_waits = [w for waits in by_heal.values() for w in waits]
    return {
        "judged": _summary(judged_waits),
        "excused": {kind: _summary(waits) for kind, waits in sorted(excused.items())},
        "before_any_judged_fault": _summary(before_any),
    }


def _summary(waits: Sequence[float]) -> dict[str, Any]:
    return {"jobs": len(waits), "longest_s": max(waits, default=None)}


def _excuse(older: Sequence[dict[str, Any]], created: float, started: float) -> str | None:
    """The kind of the first older fault whose span the wait overlaps."""
    for fault in older:
        if fault["began"] <= started and created <= fault["ended"] + AFTER_S[fault["kind"]]:
            return str(fault["kind"])
    return None


def _fault_of(judged: Sequence[dict[str, Any]], created: float, started: float) -> int | None:
    """The judged fault that began before the job started and after which it waited
    longest: the latest before its creation, or else the first during its wait."""
    waits = [
        (started - max(created, f["began"]), f["began"], i)
        for i, f in enumerate(judged)
        if f["began"] <= started
    ]
    return max(waits)[2] if waits else None


def _stalls(lines: dict[str, list[Line]]) -> dict[str, dict[str, int]]:
    """What each process's stall watch said, whichever fault (if any) it followed: a watch
    that fires where no fault stopped a consumer is worth a look."""
    counts: dict[str, dict[str, int]] = {}
    for name, logged in sorted(lines.items()):
        said = {
            "stuck": sum(STUCK in line.text for line in logged),
            "gave_up": sum(GAVE_UP in line.text for line in logged),
            "thread_died": sum(THREAD_DIED in line.text for line in logged),
        }
        if any(said.values()):
            counts[name] = said
    return counts
