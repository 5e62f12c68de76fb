"""The comparison's report: a table of tokens/s with ratios to the engine limit, and a
chart (throughput bars, latency against offered load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SYSTEMS = ("engine", "run-batch", "serve", "inferq-batch", "inferq-jobs")


def table(results: dict[str, Any]) -> str:
    """Markdown: bulk throughput with ratios, idle latency, load, pipeline ceiling."""
    rates = {name: results[name]["tokens_per_s"] for name in SYSTEMS if name in results}

    def ratio(name: str, peer: str) -> str:
        return f"{rates[name] / rates[peer]:.3f}" if name in rates and peer in rates else "-"

    out = [
        "| system | requests | seconds | tokens/s | x engine | x run-batch | x serve |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in rates:
        r = results[name]
        out.append(
            f"| {name} | {r['requests']} | {r['seconds']:.1f} | {r['tokens_per_s']:.0f} "
            f"| {ratio(name, 'engine')} | {ratio(name, 'run-batch')} | {ratio(name, 'serve')} |"
        )
    if "idle" in results and "engine" in results:
        floor_ms = results["engine"]["single_request_s"] * 1000
        p50_ms = results["idle"]["p50_s"] * 1000
        out += [
            "",
            f"Idle system, one job at a time ({results['idle']['jobs']} jobs): inferq p50 "
            f"{p50_ms:.0f} ms to the result; the raw engine alone {floor_ms:.0f} ms "
            f"(+{p50_ms - floor_ms:.0f} ms).",
        ]
    if results.get("interactive"):
        out += ["", "| offered jobs/s | jobs | p50 ms | p95 ms | p99 ms |", "|---|---|---|---|---|"]
        for p in results["interactive"]:
            out.append(
                f"| {p['rate']:g} | {p['jobs']} | {p['p50_s'] * 1000:.0f} "
                f"| {p['p95_s'] * 1000:.0f} | {p['p99_s'] * 1000:.0f} |"
            )
    if "pipeline" in results:
        p = results["pipeline"]
        out += [
            "",
            f"Pipeline ceiling (instant engine): {p['batch_jobs_per_s']:.0f} jobs/s for "
            f"{p['batch_lines']} batch lines, {p['single_jobs_per_s']:.0f} jobs/s for "
            f"{p['single_jobs']} single jobs.",
        ]
    return "\n".join(out)


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [n for n in SYSTEMS if n in results]
    bars.bar(names, [results[n]["tokens_per_s"] for n in names], color="#4c72b0")
    bars.set_ylabel("generated tokens/s")
    bars.set_title("Bulk throughput (same prompts, same engine settings)")
    bars.tick_params(axis="x", rotation=20)
    if results.get("interactive"):
        points = results["interactive"]
        rates = [p["rate"] for p in points]
        for key in ("p50_s", "p95_s", "p99_s"):
            lines.plot(rates, [p[key] * 1000 for p in points], marker="o", label=key[:3])
        floor = results["engine"]["single_request_s"] * 1000
        lines.axhline(floor, color="grey", linestyle="--", label="raw engine, alone")
        lines.set_xlabel("offered load (jobs/s)")
        lines.set_ylabel("time to result (ms)")
        lines.set_title("inferq interactive latency against load")
        lines.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
