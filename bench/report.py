"""The comparison's report: a table of tokens/s with ratios to the engine limit, and a
chart (throughput bars, latency against offered load)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SYSTEMS = ("engine", "run-batch", "serve", "inferq-batch", "inferq-jobs")


def table(results: dict[str, Any]) -> str:
    engine = results["engine"]["tokens_per_s"]
    rows = ["| system | requests | seconds | tokens/s | x engine limit |", "|---|---|---|---|---|"]
    for name in SYSTEMS:
        if name in results:
            r = results[name]
            rows.append(
                f"| {name} | {r['requests']} | {r['seconds']:.1f} | {r['tokens_per_s']:.0f} "
                f"| {r['tokens_per_s'] / engine:.3f} |"
            )
    return "\n".join(rows)


def chart(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [
        n for n in ("engine", "run-batch", "serve", "inferq-batch", "inferq-jobs") if n in results
    ]
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
