"""Every benchmark run on record: bench/results/runs.toml says, for each results file
(and for runs whose figures were kept without one), its benchmark, commit, date and host.

A results file may instead carry the same fields itself, as a top-level `"run"` object
(`{"benchmark": ..., "commit": ..., "date": ..., "host": ...}`, `host` a key of
runs.toml's `[hosts]` or a description, `"gpu": true` on a GPU host).
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")
MANIFEST = RESULTS / "runs.toml"


@dataclass(frozen=True)
class Host:
    text: str
    gpu: bool = False


@dataclass(frozen=True)
class Run:
    """One run: where it came from, and its figures (`data`: its results file's JSON;
    `given`: figures written down where no file was kept)."""

    benchmark: str
    commit: str
    date: str
    host: Host
    file: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    given: dict[str, Any] = field(default_factory=dict)
    note: str = ""  # shown in the history
    caveats: dict[str, str] = field(default_factory=dict)  # by figure: shown wherever it is
    order: int = 0
    current: bool = True  # False: kept in the history, never shown as the current figure

    @property
    def when(self) -> tuple[str, int]:
        """Sorts runs oldest first: by date, then in the order they are listed."""
        return (self.date, self.order)


def load_runs(results: Path = RESULTS) -> list[Run]:
    """Every run, oldest first."""
    manifest = tomllib.loads((results / MANIFEST.name).read_text())
    hosts = {key: Host(**value) for key, value in manifest["hosts"].items()}
    runs = []
    for order, entry in enumerate(manifest["run"]):
        data = json.loads((results / entry["file"]).read_text()) if "file" in entry else {}
        runs.append(_run(entry, hosts, data, order))
    listed = {entry.get("file") for entry in manifest["run"]}
    for order, path in enumerate(sorted(results.glob("*.json")), start=len(runs)):
        if path.name not in listed:
            data = json.loads(path.read_text())
            own = data.get("run") if isinstance(data, dict) else None
            if own is None:
                raise ValueError(
                    f'{path.name}: no entry in {MANIFEST.name} and no "run" object: say its '
                    "benchmark, commit, date and host"
                )
            runs.append(_run({**own, "file": path.name}, hosts, data, order))
    return sorted(runs, key=lambda run: run.when)


def _run(entry: dict[str, Any], hosts: dict[str, Host], data: Any, order: int) -> Run:
    host = entry["host"]
    return Run(
        benchmark=entry["benchmark"],
        commit=entry.get("commit", ""),
        date=str(entry["date"]),
        host=hosts.get(host) or Host(text=host, gpu=bool(entry.get("gpu"))),
        file=entry.get("file"),
        data=data if isinstance(data, dict) else {"rows": data},
        given=entry.get("figures", {}),
        note=entry.get("note", ""),
        caveats=entry.get("caveats", {}),
        order=order,
        current=entry.get("current", True),
    )
