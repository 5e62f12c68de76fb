"""`inferq run` on a batch file, in a process of its own: SQLite and an in-process queue,
no Postgres or Redis. Timed as run-batch is: its wall time less the time until its engine
was up, which it says ("loaded in 12.3 s"). It reads and checks the whole file before it
loads the model (a bad line is refused before a long load), so unlike run-batch's, that
work falls in its start-up, not in its processing."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from bench.peers import run_timed, throughput


def run_inferq_local(batch_file: Path, env: dict[str, str], workdir: Path) -> dict[str, Any]:
    """The file through `inferq run` with the environment `env` (INFERQ_ settings)."""
    out, state = workdir / "inferq-run.out.jsonl", workdir / "inferq-run.state"
    for stale in (out, state):  # a state file left from an earlier run would skip its lines
        stale.unlink(missing_ok=True)
    command = [sys.executable, "-m", "cli.main", "run", str(batch_file)]
    wall, up_s = run_timed(
        [*command, "-o", str(out), "--state", str(state)],
        log=workdir / "inferq-run.log",
        up=b"loaded in ",
        env={**os.environ, **env},
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    tokens = sum(line["response"]["body"]["usage"]["completion_tokens"] for line in lines)
    return throughput(wall - up_s, tokens, len(lines), wall_s=wall, load_s=up_s)
