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

    Where it does (autogroup: a process outside any CPU cgroup), the kernel shares the
    cores between sessions first, whatever the nice of their threads, so vLLM's spinning
    processes in the worker's session can keep the API's and Postgres's sessions waiting;
    a higher nice for the whole session puts their short work first, and the engine still
    gets every core nobody else wants. In a container autogroup does not apply (docs:
    Operations, Running on a CPU). A session the worker does not lead is left alone."""
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
