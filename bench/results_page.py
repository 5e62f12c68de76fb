"""The generated parts of bench/RESULTS.md and README.md: the current figure of each
benchmark, and each benchmark's history, read from bench/results/ (runs.py, figures.py).

`python -m bench.results_page --write` rewrites every block between
`<!-- figures:NAME:start -->` and `<!-- figures:NAME:end -->` in both files; a test fails
while a block is not what this module makes of the results.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable
from pathlib import Path

from bench.figures import FIGURES, Figure, Values
from bench.runs import Run, load_runs

ROOT = Path(__file__).resolve().parents[1]
PAGES = (ROOT / "bench" / "RESULTS.md", ROOT / "README.md")
# README's table: these figures, each as last measured on a CPU host; then on a GPU host.
README_CPU = (
    "batch-x-run-batch",
    "batch-x-engine",
    "jobs-x-serve",
    "chats-x-serve",
    "ttft-1",
    "ttft-64",
    "cpu-x-serve",
    "estimate-error",
    "fairness",
    # The whole stack at a GPU's pace, on a CPU host (bench.at_gpu_pace).
    "pace-bench",
    "pace-short",
    "pace-long",
    "pace-online",
    "pace-fleet",
    "pace-run",
)
README_GPU = ("run-x-engine", "batch-x-engine", "jobs-x-serve", "run-batch-x-engine")
_BLOCK = re.compile(
    r"(<!-- figures:(?P<name>[\w-]+):start -->\n).*?(<!-- figures:(?P=name):end -->)", re.S
)


def values(figure: Figure, run: Run) -> Values | None:
    if not figure.reads(run.benchmark):
        return None
    if figure.key in run.given:
        given = run.given[figure.key]
        return tuple(given) if isinstance(given, list) else (given,)
    return figure.read(run.data) if run.data else None


def current(figure: Figure, runs: Iterable[Run], *, gpu: bool) -> tuple[Run, Values] | None:
    """The newest run on a host with (or without) a GPU that has this figure."""
    found = [
        (run, v)
        for run in runs
        if run.current and run.host.gpu == gpu and (v := values(figure, run))
    ]
    return found[-1] if found else None


def current_table(runs: list[Run], *, link: str) -> str:
    """Every figure as last measured, on a CPU host and, where it was, on a GPU host."""
    rows = ["| what | inferq | against | machine | commit, date |", "|---|---|---|---|---|"]
    for gpu in (False, True):
        for figure in FIGURES:
            if found := current(figure, runs, gpu=gpu):
                rows.append(_row(figure, *found, link=link))
    return "\n".join(rows)


def readme_table(runs: list[Run]) -> str:
    rows = ["| what | inferq | against | machine | run |", "|---|---|---|---|---|"]
    by_key = {figure.key: figure for figure in FIGURES}
    for key in README_CPU:
        if found := current(by_key[key], runs, gpu=False):
            rows.append(_row(by_key[key], *found, link="bench/", with_date=False))
    for key in README_GPU:
        figure = by_key[key]
        if found := current(figure, runs, gpu=True):
            rows.append(_row(figure, *found, link="bench/", with_date=False))
        else:
            rows.append(
                f"| {figure.what} | not yet measured on a GPU | {figure.against} | a GPU | |"
            )
    return "\n".join(rows)


def history_table(benchmark: str, runs: list[Run], *, link: str) -> str:
    """Each run with a figure of this benchmark, newest first: commit, date, host, figures."""
    figures = [f for f in FIGURES if f.benchmark == benchmark]
    measured = [(run, [values(f, run) for f in figures]) for run in reversed(runs)]
    measured = [(run, found) for run, found in measured if any(found)]
    shown = [i for i, f in enumerate(figures) if any(found[i] for _, found in measured)]
    header = ["commit", "date", "host", *(_short(figures[i]) for i in shown), "run", "note"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run, found in measured:
        cells = [f"`{run.commit}`" if run.commit else "", run.date, run.host.text]
        cells += [figures[i].show(found[i]) if found[i] else "" for i in shown]
        caveats = [run.caveats[f.key] for f in figures if f.key in run.caveats]
        cells += [_link(run, link), "; ".join([*caveats, *filter(None, [run.note])])]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render(text: str, runs: list[Run], *, link: str) -> str:
    """`text` with every figures block made anew."""

    def block(match: re.Match[str]) -> str:
        name = match["name"]
        if name == "current":
            made = current_table(runs, link=link)
        elif name == "readme":
            made = readme_table(runs)
        else:
            made = history_table(name.replace("-", "_"), runs, link=link)
        return f"{match[1]}{made}\n{match[3]}"

    return _BLOCK.sub(block, text)


def stale(runs: list[Run] | None = None) -> list[Path]:
    """The pages whose blocks are not what the results make."""
    runs = load_runs() if runs is None else runs
    return [
        page
        for page in PAGES
        if render(page.read_text(), runs, link=_base(page)) != page.read_text()
    ]


def _row(figure: Figure, run: Run, found: Values, *, link: str, with_date: bool = True) -> str:
    shown = figure.show(found)
    if caveat := run.caveats.get(figure.key):
        shown += f" ({caveat})"
    place = f"`{run.commit}`, {run.date}" if run.commit else run.date
    last = place if with_date else f"{_link(run, link)}, {place}"
    return f"| {figure.what} | {shown} | {figure.against} | {run.host.text} | {last} |"


def _link(run: Run, base: str) -> str:
    if run.file:
        return f"[{run.file}]({base}results/{run.file})"
    anchor = "gpu" if run.host.gpu else run.benchmark.replace("_", "-")
    return (
        f"[{run.benchmark}]({base}RESULTS.md#{anchor})" if base else f"[{run.benchmark}](#{anchor})"
    )


def _short(figure: Figure) -> str:
    return figure.column or figure.what.split(",")[0]


def _base(page: Path) -> str:
    return "" if page.parent.name == "bench" else "bench/"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="rewrite the blocks in place")
    args = parser.parse_args()
    runs = load_runs()
    for page in PAGES:
        made = render(page.read_text(), runs, link=_base(page))
        if args.write:
            page.write_text(made)
        print(f"{page.relative_to(ROOT)}: {'written' if args.write else 'checked'}")


if __name__ == "__main__":
    main()
