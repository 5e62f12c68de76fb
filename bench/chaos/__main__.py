"""Chaos under load: every fault at once, and nothing lost or done twice.

    python -m bench.chaos --minutes 5 --seed 1          # before a release
    python -m bench.chaos --minutes 60 --seed 7 --out bench/results/chaos-7

A deployment of the real processes (bench/chaos/cluster.py) runs a steady mixed load
(bench/chaos/load.py) for `--minutes` while faults (bench/chaos/faults.py) come every
`--every` seconds (drawn from the seed). Processes that exit with no fault meaning them to
are started again, as compose's `restart: unless-stopped` would, and logged with their
exit codes (the fault log's `exited`). Then the load and the faults stop, every process is
up, and the run waits (up to `--settle-minutes`) for every job, batch and webhook delivery
to end; the checker (bench/chaos/check.py) reads the history, the fault log, the
processes' logs and Postgres. Written to `--out`: report.json (findings, counts, faults by
kind, the time things took to settle, heal times and waits against the bound),
history.jsonl, faults.jsonl and every process's log. Exit status 1 if anything was lost or
done twice, an idempotent retry made a second job, a batch's counts disagree with its
lines, a webhook was never delivered, a job waited past the bound after a process stopped
taking work, or such a process never took work again (bench/chaos/waits.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

from bench.chaos.check import check
from bench.chaos.cluster import Cluster
from bench.chaos.faults import KINDS, FaultLog, Injector
from bench.chaos.load import History, Load

SUPERVISE_EVERY_S = 2.0
SETTLE_POLL_S = 2.0

log = logging.getLogger("bench.chaos")


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--every", default="30,90", help="seconds between faults: low,high")
    parser.add_argument("--settle-minutes", type=float, default=15.0)
    parser.add_argument(
        "--faults", default=",".join(KINDS), help="the kinds to draw from (all by default)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/chaos"))
    args = parser.parse_args()
    if unknown := set(args.faults.split(",")) - set(KINDS):
        parser.error(f"unknown fault kinds: {', '.join(sorted(unknown))}")
    return args


def _supervise(cluster: Cluster, faults: FaultLog, stop: threading.Event) -> None:
    while not stop.wait(SUPERVISE_EVERY_S):
        try:
            _restart_exited(cluster, faults)
        except Exception:
            log.exception("supervising failed")


def _restart_exited(cluster: Cluster, faults: FaultLog) -> None:
    for exited in cluster.supervise():
        now = time.time()
        faults.add("exited", exited.name, now, now, exit_code=exited.code)


def _settled(database_url: str) -> dict[str, int]:
    """What has yet to end: jobs, batches, webhook deliveries."""
    with psycopg.connect(database_url.replace("+psycopg", ""), connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')), "
            "(SELECT count(*) FROM batches WHERE status IN "
            "('validating', 'in_progress', 'finalizing', 'cancelling')), "
            "(SELECT count(*) FROM webhook_deliveries WHERE state IN "
            "('pending', 'delivering'))"
        ).fetchone()
    assert row is not None
    return {"jobs": row[0], "batches": row[1], "webhooks": row[2]}


def _settle(cluster: Cluster, timeout_s: float) -> float | None:
    """Seconds until nothing is left to end, or None if something still is at the end."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        try:
            left = _settled(cluster.database_url)
        except psycopg.Error:
            left = None
        if left is not None and not any(left.values()):
            return time.monotonic() - started
        time.sleep(SETTLE_POLL_S)
    return None


def _after_last_fault(database_url: str, last_fault_s: float | None) -> float | None:
    """The longest any job stayed queued or running after the last fault ended."""
    if last_fault_s is None:
        return None
    with psycopg.connect(database_url.replace("+psycopg", "")) as conn:
        row = conn.execute(
            "SELECT max(extract(epoch FROM finished_at) - greatest(extract(epoch FROM "
            "created_at), %s)) FROM jobs WHERE finished_at IS NOT NULL",
            (last_fault_s,),
        ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def main() -> None:
    args = _parse()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    low, high = (float(x) for x in args.every.split(","))
    cluster = Cluster(args.out / "work")
    history, faults = History(), FaultLog()
    report: dict[str, Any] = {"seed": args.seed, "minutes": args.minutes}
    try:
        cluster.start()
        cluster.wait_ready()
        load = Load(
            cluster.api_urls(), history=history, webhook_url=cluster.receiver.url, seed=args.seed
        )

        async def run() -> None:
            stop = asyncio.Event()
            injector = Injector(
                cluster,
                load,
                asyncio.get_running_loop(),
                seed=args.seed,
                every_s=(low, high),
                faults=faults,
                kinds=tuple(args.faults.split(",")),
            )
            supervising = threading.Event()
            supervisor = threading.Thread(
                target=_supervise, args=(cluster, faults, supervising), daemon=True
            )
            supervisor.start()
            load_task = asyncio.create_task(load.run(stop))
            injector.start()
            await asyncio.sleep(args.minutes * 60)
            await asyncio.to_thread(injector.stop)
            stop.set()
            await load_task
            supervising.set()
            supervisor.join()

        started = time.time()
        asyncio.run(run())
        log.info("load and faults stopped after %.0f s; settling", time.time() - started)
        _restart_exited(cluster, faults)
        cluster.receiver.start()  # a no-op unless a fault left it down
        report["settle_s"] = _settle(cluster, args.settle_minutes * 60)
        report["longest_after_last_fault_s"] = _after_last_fault(
            cluster.database_url, faults.last_ended()
        )
        report["faults"] = dict(Counter(e["kind"] for e in faults.entries))
        report["faults_not_fired"] = dict(
            Counter(e["kind"] for e in faults.entries if e.get("fired") is False)
        )
        report.update(
            check(
                history=history,
                deliveries=cluster.receiver.snapshot(),
                faults=faults.entries,
                logs=cluster.logs,
                database_url=cluster.database_url,
                api_url=cluster.api_urls()[0],
            )
        )
    finally:
        (args.out / "history.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in history.records)
        )
        (args.out / "faults.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in faults.entries)
        )
        (args.out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        cluster.stop()
    print(json.dumps({k: v for k, v in report.items() if k != "examples"}, indent=2))
    for name, examples in report.get("examples", {}).items():
        print(f"{name}:", *examples, sep="\n  ")
    raise SystemExit(1 if report.get("failed") else 0)


if __name__ == "__main__":
    main()
