"""The pipeline's ceiling and what it costs in CPU: single jobs (`POST
/v1/jobs?wait=`; and, as `single_jobs_polled`, a `POST` then a long-poll `GET` for the
result) and online chats (`POST /v1/chat/completions`, not
streamed) through one API process, with the pipeline-only engine (no model: it answers at
once), so only API, Redis, the GPU worker and Postgres are measured; and the CPU seconds
each process spent per request, read from /proc before and after each step.

    python -m bench.pipeline [--requests 5000] [--concurrency 256] [--profile DIR]

`--profile DIR` also records the API and the worker with py-spy (`pip install py-spy`)
during each step, as collapsed stacks (`DIR/<step>-<process>.txt`) for flame graphs or
for `python -m bench.pipeline --top FILE`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import drive, stack, workload
from bench.peers import SERVED
from inferq.host.processes import descendants

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _stat_cpu_s(stat: Path) -> float | None:
    """User + system CPU seconds in a `/proc` stat file, or None once it is gone."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process and its threads have used, or 0 once gone."""
    return _stat_cpu_s(Path(f"/proc/{pid}/stat")) or 0.0


def by_name(*names: str) -> list[int]:
    """Every process whose command name is one of `names` (Postgres's backends, Redis)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except FileNotFoundError:
                continue
            if comm in names:
                found.append(int(entry.name))
    return found


class CpuMeter:
    """CPU seconds per group of processes between `start` and `stop`; a group's process
    list is taken again at each end, so backends that come and go are counted."""

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self._groups = groups
        self._before: dict[str, dict[int, float]] = {}

    def read(self) -> dict[str, dict[int, float]]:
        """Each group's processes now, with the CPU seconds each has spent."""
        return {name: {pid: cpu_s(pid) for pid in pids()} for name, pids in self._groups.items()}

    def start(self) -> None:
        self._before = self.read()

    def stop(self) -> dict[str, float]:
        after = self.read()
        return {
            name: sum(seconds - self._before[name].get(pid, 0.0) for pid, seconds in pids.items())
            for name, pids in after.items()
        }


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds each thread of a process has used, by thread id ({} once gone)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return {}
    seconds = {int(task.name): _stat_cpu_s(task / "stat") for task in tasks}
    return {tid: s for tid, s in seconds.items() if s is not None}


def thread_names(pid: int) -> dict[int, str]:
    """Each Python thread's name by thread id, from `py-spy dump` (numbers in a name
    dropped, so a pool's threads share one: `ThreadPoolExecutor-*`); {} without py-spy.
    Threads that run no Python (a tokenizer's, say) are not named."""
    spy = shutil.which("py-spy")
    if spy is None:
        return {}
    dumped = subprocess.run(
        [spy, "dump", "--pid", str(pid), "--json"], capture_output=True, text=True, check=False
    )
    if dumped.returncode != 0:
        return {}
    return {
        thread["os_thread_id"]: re.sub(r"\d+", "*", thread["thread_name"] or "unnamed")
        for thread in json.loads(dumped.stdout)
    }


class ThreadMeter:
    """CPU seconds per named thread of some processes between `start` and `stop`
    (threads that run no Python are counted as "native"; those that ended meanwhile, an
    idle pool thread say, as "ended")."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = pids
        self._before: dict[str, tuple[float, dict[int, float]]] = {}

    def start(self) -> None:
        self._before = {name: (cpu_s(pid), thread_cpu_s(pid)) for name, pid in self._pids.items()}

    def stop(self) -> dict[str, dict[str, float]]:
        spent: dict[str, dict[str, float]] = {}
        for name, pid in self._pids.items():
            total, after, names = cpu_s(pid), thread_cpu_s(pid), thread_names(pid)
            total_before, before = self._before[name]
            threads: Counter[str] = Counter()
            for tid, seconds in after.items():
                threads[names.get(tid, "native")] += seconds - before.get(tid, 0.0)
            # A process's own figure keeps what its ended threads used.
            threads["ended"] = max(0.0, total - total_before - sum(threads.values()))
            spent[name] = dict(threads.most_common())
        return spent


@contextmanager
def profiled(pids: dict[str, int], directory: Path | None, step: str) -> Iterator[None]:
    """py-spy on each of `pids` while the block runs, if `directory` is given."""
    if directory is None:
        yield
        return
    spy = shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy: pip install py-spy")
    recorders = [
        subprocess.Popen(
            [
                spy,
                "record",
                "--pid",
                str(pid),
                "--rate",
                "200",
                "--format",
                "raw",
                "--nonblocking",
                "--threads",
                # Only threads running Python: a thread waiting on a socket in C looks
                # busy to py-spy otherwise.
                "--gil",
                "--output",
                str(directory / f"{step}-{name}.txt"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for name, pid in pids.items()
    ]
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.send_signal(2)  # SIGINT: py-spy writes its file and exits
        for recorder in recorders:
            recorder.wait(timeout=60)


def top(path: Path, count: int = 40) -> list[tuple[str, float]]:
    """From collapsed stacks: each function's share of the samples it appears in
    (inclusive), the most first."""
    inclusive: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack_text, _, samples = line.rpartition(" ")
        n = int(samples)
        total += n
        for frame in set(stack_text.split(";")):
            inclusive[frame] += n
    return [(frame, n / total) for frame, n in inclusive.most_common(count)]


def chats(base_url: str, bodies: list[dict[str, Any]], *, concurrency: int) -> Any:
    """Online chats to inferq, `concurrency` in flight: throughput figures."""

    async def run() -> dict[str, Any]:
        async with drive.inferq_session(base_url, connections=concurrency) as client:
            return await drive.closed_loop(client, drive.chat_tokens, bodies, concurrency)

    return asyncio.run(run())


def run(requests: int, concurrency: int, profile: Path | None) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    bodies = [
        workload.body(workload.Request(f"p{i}", f"item {i}", 1), SERVED) for i in range(requests)
    ]
    with ExitStack() as cleanup:
        url = cleanup.enter_context(stack.database())
        prefix = cleanup.enter_context(stack.key_prefix())
        env = stack.service_env(
            model=stack.demo_model(),  # only its tokenizer is used
            database_url=url,
            prefix=prefix,
            INFERQ_ENGINE="pipeline-only",
            INFERQ_ALLOW_BENCHMARK_ENGINE="true",
            INFERQ_MAX_NUM_SEQS="256",
            INFERQ_MAX_BATCH_SIZE="256",
            TOKENIZERS_PARALLELISM="false",
        )
        api, base_url = cleanup.enter_context(stack.api(env, workdir))
        worker = stack.Process(
            ["worker", "--name", "bench@host"],
            env={**env, "INFERQ_WORKER_METRICS_PORT": str(stack.free_port())},
            log=workdir / "worker.log",
        )
        cleanup.callback(worker.stop)
        worker.wait_for(" ready.", timeout_s=600)
        meter = CpuMeter(
            {
                "api": lambda: descendants(api.popen.pid),
                "worker": lambda: descendants(worker.popen.pid),
                "postgres": lambda: by_name("postgres"),
                "redis": lambda: by_name("redis-server"),
            }
        )
        # Warm up: the model's tokenizer and template, connection pools.
        drive.inferq_jobs(base_url, bodies[:200], concurrency=concurrency)
        chats(base_url, bodies[:200], concurrency=concurrency)
        results: dict[str, Any] = {}
        steps: dict[str, Callable[[str, list[dict[str, Any]]], Any]] = {
            "single_jobs": lambda u, b: drive.inferq_jobs(u, b, concurrency=concurrency),
            "single_jobs_polled": lambda u, b: drive.inferq_jobs(
                u, b, concurrency=concurrency, wait_in_post=False
            ),
            "online_chats": lambda u, b: chats(u, b, concurrency=concurrency),
        }
        pids = {"api": api.popen.pid, "worker": worker.popen.pid}
        threads = ThreadMeter(pids)
        for step, call in steps.items():
            meter.start()
            threads.start()
            started = time.perf_counter()
            with profiled(pids, profile, step):
                figures = call(base_url, bodies)
            seconds = time.perf_counter() - started
            cpu = meter.stop()
            named = threads.stop()
            results[step] = {
                "requests": requests,
                "concurrency": concurrency,
                "requests_per_s": requests / seconds,
                "cpu_ms_per_request": {k: 1000 * v / requests for k, v in cpu.items()},
                "cores": {k: v / seconds for k, v in cpu.items()},
                "thread_ms_per_request": {
                    process: {name: round(1000 * v / requests, 3) for name, v in spent.items()}
                    for process, spent in named.items()
                },
                "client": figures,
            }
            print(step, json.dumps(results[step], indent=1), flush=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=256)
    parser.add_argument("--profile", type=Path, help="record py-spy profiles here")
    parser.add_argument("--top", type=Path, help="summarize one recorded profile and exit")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    if args.top:
        for frame, share in top(args.top):
            print(f"{share:6.1%}  {frame[:150]}")
        return
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    results = run(args.requests, args.concurrency, args.profile)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
