"""What each benchmark's figure is, and how to read it from a run's results.

A `Figure` reads its values from a results file's JSON (`read`, None when the run has
not that step) or takes them from the figures runs.toml gives a run without a file, and
says them in words (`show`). A new benchmark adds its figures here; a new run of an
existing one needs only its results file and its entry in runs.toml.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Values = tuple[float, ...]
TIMES = "\u00d7"  # the sign after a ratio
AT_PACE = "at an H100's pace (a paced engine, no GPU)"


@dataclass(frozen=True)
class Figure:
    key: str
    benchmark: str  # its section of RESULTS.md: the bench module, as `python -m bench.X`
    what: str
    against: str
    read: Callable[[dict[str, Any]], Values | None]
    show: Callable[[Values], str]
    also: tuple[str, ...] = ()  # other benchmarks whose results have this figure
    column: str = ""  # its heading in a history table, where `what` is too long

    def reads(self, benchmark: str) -> bool:
        return benchmark == self.benchmark or benchmark in self.also


def _rate(data: dict[str, Any], step: str) -> float | None:
    entry = data.get(step)
    return entry.get("tokens_per_s") if isinstance(entry, dict) else None


def _ratio(step: str, peer: str) -> Callable[[dict[str, Any]], Values | None]:
    def read(data: dict[str, Any]) -> Values | None:
        mine, theirs = _rate(data, step), _rate(data, peer)
        return (mine / theirs,) if mine and theirs else None

    return read


def _against_serve(kind: str) -> Callable[[dict[str, Any]], Values | None]:
    """inferq's `kind` (jobs, chats) over serve's chats at 64 and 256 in flight: each side's
    tokens over its seconds, over every turn of the run."""

    def read(data: dict[str, Any]) -> Values | None:
        ratios = []
        for concurrency in (64, 256):
            mine = _tokens_per_s(data, f"inferq-{kind}", concurrency)
            theirs = _tokens_per_s(data, "serve-chats", concurrency)
            if kind == "jobs" and mine is None:  # bench.compare's keys
                mine = _rate(data, "inferq-jobs-64" if concurrency == 64 else "inferq-jobs")
                theirs = _rate(data, "serve" if concurrency == 64 else "serve-256")
            if not (mine and theirs):
                return None
            ratios.append(mine / theirs)
        return tuple(ratios)

    return read


def _tokens_per_s(data: dict[str, Any], step: str, concurrency: int) -> float | None:
    pattern = re.compile(rf"{re.escape(step)}@{concurrency}(#\d+)?$")
    steps = [v for k, v in data.items() if pattern.match(k)]
    seconds = sum(s["seconds"] for s in steps)
    return sum(s["generated_tokens"] for s in steps) / seconds if seconds else None


def _cpu_beside_engine(data: dict[str, Any]) -> Values | None:
    """CPU ms a single job at 64 takes inferq's processes but the engine, and a chat
    serve's front end, over every turn of the run."""
    mine = _cpu_ms(data, "inferq-jobs@64", lambda cpu: sum(cpu.values()) - cpu["engine"])
    theirs = _cpu_ms(data, "serve-chats@64", lambda cpu: cpu["front"])
    return (mine, theirs) if mine and theirs else None


def _cpu_ms(data: dict[str, Any], step: str, part: Callable[[dict[str, float]], float]) -> float:
    steps = [v for k, v in data.items() if re.match(rf"{re.escape(step)}(#\d+)?$", k)]
    requests = sum(s["requests"] for s in steps)
    return sum(part(s["cpu_s"]) for s in steps) * 1000 / requests if requests else 0.0


def _worker_cpu(data: dict[str, Any]) -> Values | None:
    """The GPU worker's CPU ms beside vLLM's output handling (its engine loop and vLLM's
    output thread left out): a single job, a batch line."""
    values = []
    for step in ("inferq-jobs", "inferq-batch"):
        threads = data.get(step, {}).get("thread_ms_per_request", {}).get("worker")
        if not threads:
            return None
        engine = threads.get("engine-loop", 0) + threads.get("EngineCoreOutputQueueThread", 0)
        values.append(data[step]["cpu_ms_per_request"]["worker"] - engine)
    return tuple(values)


def _ttft(mine: str, theirs: str) -> Callable[[dict[str, Any]], Values | None]:
    def read(data: dict[str, Any]) -> Values | None:
        if mine not in data or theirs not in data:
            return None
        return ((data[mine]["ttft_p50_s"] - data[theirs]["ttft_p50_s"]) * 1000,)

    return read


def _idle(data: dict[str, Any]) -> Values | None:
    if "idle" not in data or "single_request_s" not in data.get("engine", {}):
        return None
    return ((data["idle"]["p50_s"] - data["engine"]["single_request_s"]) * 1000,)


def _estimates(data: dict[str, Any]) -> Values | None:
    batches = [v for k, v in data.items() if k != "engine" and isinstance(v, dict)]
    errors = [
        abs(b["max_abs_error_from_10pct"]) for b in batches if "max_abs_error_from_10pct" in b
    ]
    return (max(errors) * 100, len(errors)) if errors else None


def _fresh_estimate(data: dict[str, Any]) -> Values | None:
    batch = data.get("first", data)
    error = batch.get("largest_error_from_10_percent")
    return (abs(error) * 100, 1.0 if "other" in data else 0.0) if error is not None else None


def _key(*path: str) -> Callable[[dict[str, Any]], Values | None]:
    def read(data: dict[str, Any]) -> Values | None:
        node: Any = data
        for part in path:
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return (float(node),)

    return read


def _fairness(data: dict[str, Any]) -> Values | None:
    beside = data.get("beside")
    if not beside:
        return None
    return (
        beside["small_lines"],
        beside["big_lines"],
        beside["small_s"],
        beside["big_share_left_then"],
    )


def _chaos(data: dict[str, Any]) -> Values | None:
    counts = data.get("counts")
    if counts is None:
        return None
    broken = sum(counts.get(k, 0) for k in ("lost", "done_twice", "duplicate_idempotent_jobs"))
    return (broken, sum(data["jobs"].values()), data["minutes"])


def _soak(data: dict[str, Any]) -> Values | None:
    samples = data.get("samples")
    if not samples:
        return None
    return (data["jobs"], samples[-1]["db_mb"], data["retention"]["longest_statement_ms"])


def _paced_workloads(data: dict[str, Any], setting: str) -> dict[str, Any]:
    """bench.at_gpu_pace's figures by workload in `setting` (as `1w@table`); empty without."""
    workloads: dict[str, Any] = data.get("settings", {}).get(setting, {}).get("workloads", {})
    return workloads


def _paced(setting: str, *workloads: str) -> Callable[[dict[str, Any]], Values | None]:
    """bench.at_gpu_pace: each workload's time over its ideal's (the same paced engine with
    every line in it at once, or kept at 256 in flight), in `setting` (as `1w@table`)."""

    def read(data: dict[str, Any]) -> Values | None:
        ran = _paced_workloads(data, setting)
        found = [ran[w]["x_ideal"] for w in workloads if w in ran]
        return tuple(found) if len(found) == len(workloads) else None

    return read


def _paced_run(data: dict[str, Any]) -> Values | None:
    """`inferq run` (bench.paced, or bench.at_gpu_pace --targets) at 25 and 10 ms a step."""
    runs = data.get("inferq_run", {})
    found = [runs[pace]["x_ideal"] for pace in ("25ms", "10ms") if pace in runs]
    return tuple(found) if len(found) == 2 else None


def _paced_cpu(data: dict[str, Any]) -> Values | None:
    """CPU ms every process but the client spends a batch line of the bench file while it
    runs (its ingest apart) and a single job, at the table's pace with one worker."""
    ran = _paced_workloads(data, "1w@table")
    if "bench" not in ran or "jobs" not in ran:
        return None
    return (ran["bench"]["run_cpu_ms_per_line"]["all"], ran["jobs"]["cpu_ms_per_line"]["all"])


def _paced_cpu_beside(data: dict[str, Any]) -> Values | None:
    """The same, less the paced engine's own CPU as the workers counted it where it ran;
    None for runs made before they counted it."""
    ran = _paced_workloads(data, "1w@table")
    if "bench" not in ran or "jobs" not in ran:
        return None
    if any("ideal_engine_cpu_ms_per_line" not in ran[w] for w in ("bench", "jobs")):
        return None
    return tuple(ran[w]["cpu_ms_per_line_beside_the_engine"] for w in ("bench", "jobs"))


def _given_only(data: dict[str, Any]) -> Values | None:
    """A figure no results file has: only runs.toml gives it."""
    del data
    return None


def _x(values: Values) -> str:
    return " / ".join(f"{v:.2f}{TIMES}" for v in values)


def _at(values: Values) -> str:
    return f"{values[0]:.2f}{TIMES} at 64, {values[1]:.2f}{TIMES} at 256"


def _ms(values: Values) -> str:
    return f"{values[0]:+.0f} ms"


def _compat(data: dict[str, Any]) -> Values | None:
    """Of the ordinary shapes serve answers, how many inferq answers; inferq's 5xx."""
    counts = data.get("summary")
    if not isinstance(counts, dict):
        return None
    return (counts["inferq_answers_of_those"], counts["serve_answers"], counts["inferq_5xx"])


FIGURES: Sequence[Figure] = (
    Figure(
        "batch-x-run-batch",
        "compare",
        "a batch file through `/v1/batches`, tokens/s",
        "`vllm run-batch`, same file",
        _ratio("inferq-batch", "run-batch"),
        _x,
        column="a batch file ÷ `vllm run-batch`",
    ),
    Figure(
        "batch-x-engine",
        "compare",
        "a batch file through `/v1/batches`, tokens/s",
        "one `LLM.generate` call",
        _ratio("inferq-batch", "engine"),
        _x,
        column="a batch file ÷ `LLM.generate`",
    ),
    Figure(
        "run-x-engine",
        "compare",
        "a batch file through `inferq run`, tokens/s",
        "one `LLM.generate` call",
        _ratio("inferq-run", "engine"),
        _x,
        column="`inferq run` ÷ `LLM.generate`",
    ),
    Figure(
        "run-batch-x-engine",
        "compare",
        "`vllm run-batch` (the peer), tokens/s",
        "one `LLM.generate` call",
        _ratio("run-batch", "engine"),
        _x,
        column="`vllm run-batch` ÷ `LLM.generate`",
    ),
    Figure(
        "idle-latency",
        "compare",
        "one single job on an idle system, p50",
        "the engine alone on the same request",
        _idle,
        _ms,
    ),
    Figure(
        "pipeline-batch",
        "compare",
        "batch lines a second with no model (pipeline-only engine)",
        "",
        _key("pipeline", "batch_jobs_per_s"),
        lambda v: f"{v[0]:,.0f} lines/s",
    ),
    Figure(
        "jobs-x-serve",
        "request_cpu",
        "single jobs (`POST /v1/jobs?wait=`), tokens/s",
        "`vllm serve`, chats at the same concurrency",
        _against_serve("jobs"),
        _at,
        also=("compare",),
    ),
    Figure(
        "chats-x-serve",
        "request_cpu",
        "chat completions, not streamed, tokens/s",
        "`vllm serve` at the same concurrency",
        _against_serve("chats"),
        _at,
    ),
    Figure(
        "cpu-x-serve",
        "request_cpu",
        "CPU a single job costs beside the engine, 64 in flight",
        "`vllm serve`'s front end, a chat",
        _cpu_beside_engine,
        lambda v: f"{v[0]:.1f} ms against {v[1]:.1f} ms ({v[0] / v[1]:.1f}{TIMES})",
    ),
    Figure(
        "worker-cpu",
        "request_cpu",
        "the GPU worker's CPU beside vLLM: a single job / a batch line",
        "",
        _worker_cpu,
        lambda v: f"{v[0]:.2f} ms / {v[1]:.2f} ms",
    ),
    Figure(
        "ttft-16",
        "request_cpu",
        "a streamed chat's first token, p50, 16 in flight",
        "`vllm serve`",
        _ttft("inferq-streamed@16", "serve-streamed@16"),
        _ms,
    ),
    Figure(
        "ttft-64",
        "ttft",
        "a streamed chat's first token, p50, 64 in flight, under vLLM's own bench client",
        "`vllm serve`, the two taking turns",
        # Each inferq turn against serve's turns either side of it, over the turns.
        lambda data: (sum(data["median_ttft_x_serve"]) / len(data["median_ttft_x_serve"]),),
        _x,
    ),
    Figure(
        "ttft-1",
        "streaming",
        "a streamed chat's first token, p50, 1 in flight",
        "`vllm serve`",
        _ttft("inferq-stream-1", "serve-stream-1"),
        _ms,
    ),
    Figure(
        "pipeline-jobs",
        "pipeline",
        "single jobs a second with no model, 256 clients, one API process",
        "",
        _key("single_jobs", "requests_per_s"),
        lambda v: f"{v[0]:,.0f} jobs/s",
    ),
    Figure(
        "estimate-error",
        "estimates",
        "a batch's estimated end, from 10% of its lines on",
        "its real end",
        _estimates,
        lambda v: f"within {v[0]:.1f}% in each of {v[1]:.0f} batches",
    ),
    Figure(
        "fresh-estimate",
        "fresh_estimate",
        "the first batch on a fresh deployment: its estimate from 10% of its lines on",
        "its real end",
        _fresh_estimate,
        lambda v: f"within {v[0]:.1f}%" + (" beside another tenant's batch" if v[1] else ", alone"),
    ),
    Figure(
        "fairness",
        "fairness",
        "a small batch beside another tenant's big one",
        "",
        _fairness,
        lambda v: (
            f"{v[0]:.0f} lines end in {v[2]:.1f} s, "
            f"{v[3]:.0%} of the other's {v[1]:,.0f} still to go"
        ),
    ),
    Figure(
        "compat-shapes",
        "compat",
        "request shapes `vllm serve` answers that inferq answers too",
        "`vllm serve` on the same model",
        _compat,
        lambda v: f"{v[0]:.0f} of {v[1]:.0f}, {v[2]:.0f} with a 5xx",
        column="shapes serve answers that inferq answers",
    ),
    Figure(
        "follow",
        "follow",
        "a 20,000-line batch followed live by 10 clients, tokens/s",
        "the same batch not followed",
        _key("followed_x_alone"),
        _x,
    ),
    Figure(
        "structured-x-run-batch",
        "structured",
        "a batch under one JSON schema, tokens/s",
        "`vllm run-batch`, same file",
        _ratio("inferq", "run-batch"),
        _x,
    ),
    Figure(
        "embeddings-x-run-batch",
        "embeddings",
        "an embeddings batch file, inputs/s",
        "`vllm run-batch`, same file",
        _key("ratio"),
        _x,
    ),
    Figure(
        "ingest-50000",
        "ingest",
        "a 50,000-line batch file checked and queued",
        "",
        _given_only,
        lambda v: f"{v[0]:.1f} s",
    ),
    Figure(
        "soak",
        "soak",
        "single jobs with retention at 120 s: the database's size at the end, "
        "the longest retention statement",
        "",
        _soak,
        lambda v: f"{v[1]:.0f} MB after {v[0]:,.0f} jobs; {v[2]:.0f} ms",
    ),
    Figure(
        "chaos",
        "chaos",
        "jobs lost or done twice under load with faults",
        "",
        _chaos,
        lambda v: f"{v[0]:.0f} of {v[1]:,.0f} jobs in {v[2]:.0f} minutes",
    ),
    Figure(
        "pace-bench",
        "at_gpu_pace",
        f"the bench workload's 3,000 lines as a batch file, {AT_PACE}",
        "the same engine with every line in it at once",
        _paced("1w@table", "bench"),
        _x,
        column="bench file",
    ),
    Figure(
        "pace-short",
        "at_gpu_pace",
        f"20,000 lines of 4 output tokens as a batch file, {AT_PACE}",
        "the same engine with every line in it at once",
        _paced("1w@table", "short"),
        _x,
        column="short lines",
    ),
    Figure(
        "pace-long",
        "at_gpu_pace",
        f"500 lines of 1,024 output tokens as a batch file, {AT_PACE}",
        "the same engine with every line in it at once",
        _paced("1w@table", "long"),
        _x,
        column="long lines",
    ),
    Figure(
        "pace-online",
        "at_gpu_pace",
        f"single jobs / chat completions at 256 in flight, {AT_PACE}",
        "the same engine kept at 256 in flight",
        _paced("1w@table", "jobs", "chats"),
        _x,
        column="jobs / chats",
    ),
    Figure(
        "pace-fleet",
        "at_gpu_pace",
        "four GPU workers on one Postgres and Redis at 10 ms a step: the bench file / long lines",
        "four engines with every line shared out at once",
        _paced("4w@10ms", "bench", "long"),
        _x,
        column="4 workers @10 ms",
    ),
    Figure(
        "pace-run",
        "at_gpu_pace",
        "`inferq run` on the bench file at 25 / 10 ms a step (a paced engine, no GPU)",
        "the same engine with every line in it at once",
        _paced_run,
        _x,
        also=("paced",),
        column="`inferq run` @25 / @10 ms",
    ),
    Figure(
        "pace-cpu",
        "at_gpu_pace",
        f"CPU a batch line while it runs / a single job costs every process, {AT_PACE}",
        "",
        _paced_cpu,
        lambda v: f"{v[0]:.2f} ms / {v[1]:.2f} ms",
        column="CPU a line / a job",
    ),
    Figure(
        "pace-cpu-beside",
        "at_gpu_pace",
        f"CPU a batch line while it runs / a single job costs every process but the engine's, "
        f"{AT_PACE}",
        "",
        _paced_cpu_beside,
        lambda v: f"{v[0]:.2f} ms / {v[1]:.2f} ms",
        column="beside the engine",
    ),
)
