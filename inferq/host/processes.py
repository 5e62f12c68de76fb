"""The process tree of this host, read from /proc (Linux)."""

from __future__ import annotations

from pathlib import Path


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
