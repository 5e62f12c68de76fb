"""The comparison's report: a table of tokens/s with ratios to the engine limit, the
latency figures, and a chart (throughput bars, latency against offered load)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

# Single requests (vllm serve, inferq jobs) are driven at each of these concurrencies.
CONCURRENCIES = (64, 256)
# The keys earlier results already use: serve ran at 64, inferq's single jobs at 256.
_KEPT_KEYS = {("serve", 64): "serve", ("inferq-jobs", 256): "inferq-jobs"}
_KEPT_CONCURRENCY = {key: concurrency for (_, concurrency), key in _KEPT_KEYS.items()}


def single_key(system: str, concurrency: int) -> str:
    """The results key of `system` ("serve" or "inferq-jobs") at `concurrency`."""
    return _KEPT_KEYS.get((system, concurrency), f"{system}-{concurrency}")


SYSTEMS = (
    "engine",
    "inferq-run",
    "run-batch",
    "inferq-batch",
    *(single_key(s, c) for c in CONCURRENCIES for s in ("serve", "inferq-jobs")),
)
# The targets for the priority step: (direction, bound) on each ratio.
TARGETS = {"p50_x_idle": ("≤", 1.5), "p99_x_idle": ("≤", 2.0), "batch_x_alone": ("≥", 0.95)}


def table(results: dict[str, Any]) -> str:
    """Markdown: bulk throughput with ratios, single requests side by side, idle latency,
    load, priority under a batch, pipeline ceiling."""
    rates = {name: results[name]["tokens_per_s"] for name in SYSTEMS if name in results}

    def ratio(name: str, peer: str) -> str:
        return f"{rates[name] / rates[peer]:.3f}" if name in rates and peer in rates else "-"

    out = [
        "| system | concurrency | requests | seconds | tokens/s | x engine | x run-batch "
        "| x serve |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in rates:
        r = results[name]
        out.append(
            f"| {name} | {_concurrency(name, r)} "
            f"| {r['requests']} | {r['seconds']:.1f} "
            f"| {r['tokens_per_s']:.0f} | {ratio(name, 'engine')} | {ratio(name, 'run-batch')} "
            f"| {ratio(name, 'serve')} |"
        )
    out += _same_client(rates, ratio)
    out += _idle(results)
    if results.get("interactive"):
        out += ["", "| offered jobs/s | jobs | p50 ms | p95 ms | p99 ms |", "|---|---|---|---|---|"]
        for p in results["interactive"]:
            out.append(
                f"| {p['rate']:g} | {p['jobs']} | {p['p50_s'] * 1000:.0f} "
                f"| {p['p95_s'] * 1000:.0f} | {p['p99_s'] * 1000:.0f} |"
            )
    out += _priority(results)
    if "pipeline" in results:
        p = results["pipeline"]
        out += [
            "",
            f"Pipeline ceiling (pipeline-only engine): {p['batch_jobs_per_s']:.0f} jobs/s for "
            f"{p['batch_lines']} batch lines, {p['single_jobs_per_s']:.0f} jobs/s for "
            f"{p['single_jobs']} single jobs at concurrency {p.get('single_concurrency', 256)}.",
        ]
    return "\n".join(out)


def _concurrency(name: str, figures: dict[str, Any]) -> Any:
    return figures.get("concurrency", _KEPT_CONCURRENCY.get(name, "-"))


def _same_client(rates: dict[str, float], ratio: Callable[[str, str], str]) -> list[str]:
    """inferq's single jobs against `vllm serve`, the same client at the same concurrency."""
    out = [
        "",
        "| concurrency | serve tokens/s | x engine | inferq-jobs tokens/s | x engine "
        "| inferq-jobs / serve |",
        "|---|---|---|---|---|---|",
    ]
    for concurrency in CONCURRENCIES:
        serve, jobs = single_key("serve", concurrency), single_key("inferq-jobs", concurrency)
        if serve not in rates and jobs not in rates:
            continue
        out.append(
            f"| {concurrency} | {_rate(rates, serve)} | {ratio(serve, 'engine')} "
            f"| {_rate(rates, jobs)} | {ratio(jobs, 'engine')} | {ratio(jobs, serve)} |"
        )
    return out if len(out) > 3 else []


def _rate(rates: dict[str, float], name: str) -> str:
    return f"{rates[name]:.0f}" if name in rates else "-"


def _idle(results: dict[str, Any]) -> list[str]:
    if "idle" not in results:
        return []
    idle = results["idle"]
    p50_ms = idle["p50_s"] * 1000
    p99 = f", p99 {idle['p99_s'] * 1000:.0f} ms" if "p99_s" in idle else ""
    floor = ""
    if "engine" in results:
        floor_ms = results["engine"]["single_request_s"] * 1000
        floor = f"; the raw engine alone {floor_ms:.0f} ms (+{p50_ms - floor_ms:.0f} ms at p50)"
    return [
        "",
        f"Idle system, one job at a time ({idle['jobs']} jobs): inferq p50 "
        f"{p50_ms:.0f} ms to the result{p99}{floor}.",
    ]


def _priority(results: dict[str, Any]) -> list[str]:
    """The priority step against its targets."""
    if "priority" not in results:
        return []
    p = results["priority"]
    alone, loaded, jobs = p["batch_alone"], p["batch_loaded"], p["interactive"]
    by = p["batch_rate_by"]
    unit = "tokens/s" if by == "tokens_per_s" else "lines/s"

    def idle_ms(key: str) -> str:
        value = results.get("idle", {}).get(key)
        return "-" if value is None else f"idle {value * 1000:.0f} ms"

    rows = [
        ("interactive p50", f"{jobs['p50_s'] * 1000:.0f} ms", idle_ms("p50_s"), "p50_x_idle"),
        ("interactive p99", f"{jobs['p99_s'] * 1000:.0f} ms", idle_ms("p99_s"), "p99_x_idle"),
        (
            "batch, interactive running",
            f"{loaded[by]:.1f} {unit}",
            f"alone {alone[by]:.1f} {unit}",
            "batch_x_alone",
        ),
    ]
    out = [
        "",
        f"Priority: a batch of {p['batch_lines']} lines saturating the engine, "
        f"{p['window_s']:g} s alone, then {p['window_s']:g} s with {jobs['jobs']} interactive "
        f"jobs arriving at {jobs['rate']:g}/s (batch lines/s: {alone['lines_per_s']:.1f} "
        f"alone, {loaded['lines_per_s']:.1f} with them).",
        "",
        "| figure | measured | against | ratio | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for label, measured, against, key in rows:
        sign, target = TARGETS[key]
        got = p.get(key)
        met = got is not None and (got >= target if sign == "≥" else got <= target)
        shown = "-" if got is None else f"{got:.3f}"
        out.append(
            f"| {label} | {measured} | {against} | {shown} | {sign} {target} "
            f"| {'yes' if met else 'no'} |"
        )
    if not (alone["saturated"] and loaded["saturated"]):
        out += ["", "The batch ran out inside a window: raise --priority-batch-lines."]
    return out


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [n for n in SYSTEMS if n in results]
    # The legacy keys do not say their concurrency: the labels do.
    labels = [
        f"{n.removesuffix(f'-{c}')} @{c}" if (c := _concurrency(n, results[n])) != "-" else n
        for n in names
    ]
    bars.bar(labels, [results[n]["tokens_per_s"] for n in names], color="#4c72b0")
    bars.set_ylabel("generated tokens/s")
    bars.set_title("Bulk throughput (same prompts, same engine settings)")
    bars.tick_params(axis="x", rotation=20)
    if results.get("interactive"):
        points = results["interactive"]
        rates = [p["rate"] for p in points]
        for key in ("p50_s", "p95_s", "p99_s"):
            lines.plot(rates, [p[key] * 1000 for p in points], marker="o", label=key[:3])
        if "engine" in results:
            floor = results["engine"]["single_request_s"] * 1000
            lines.axhline(floor, color="grey", linestyle="--", label="raw engine, alone")
        lines.set_xlabel("offered load (jobs/s)")
        lines.set_ylabel("time to result (ms)")
        lines.set_title("inferq interactive latency against load")
        lines.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
