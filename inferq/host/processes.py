"""The process tree of this host and its scheduling, through /proc (Linux)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


def descendants(*roots: int) -> list[int]:
    """`roots` and every process under them."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:  # gone meanwhile
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], list(roots)
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def lower_group(nice: int, *, autogroup: Path = Path("/proc/self/autogroup")) -> int | None:
    """This process's scheduling group to `nice` if that is higher; returns the group's
    nice, or None where Linux does not group tasks by session.

    Where it does (autogroup: a process outside any CPU cgroup), the kernel first shares
    the cores between sessions, whatever the nice of their threads, and each of inferq's
    processes, each Postgres backend too, leads a session of its own. The worker's holds
    vLLM's processes, which on a CPU keep two cores busy spinning while they wait for each
    other: the API and Postgres, though at a lower nice than the engine core, then waited
    for a core for up to 2 s at a time (bench/RESULTS.md). A higher nice for the whole
    session puts their short work first; the engine still gets every core nobody else
    wants. In a container (a cgroup of its own) autogroup does not apply: give the worker's
    container a lower CPU weight instead (docs: Operations, Running on a CPU). A session the worker
    does not lead is shared with others (a shell's, a test runner's), and left alone."""
    if nice <= 0:
        return None
    if os.getsid(0) != os.getpid():
        log.info("this worker does not lead its session: its scheduling group is left alone")
        return None
    try:
        current = int(autogroup.read_text().split()[-1])
        if nice > current:
            autogroup.write_text(str(nice))
            current = nice
    except FileNotFoundError:
        log.info("this kernel does not group tasks by session: INFERQ_ENGINE_GROUP_NICE is moot")
        return None
    except (OSError, ValueError) as exc:
        log.warning("cannot lower this worker's scheduling group (%s)", exc)
        return None
    log.info("this worker's scheduling group runs at nice %d (INFERQ_ENGINE_GROUP_NICE)", current)
    return current
