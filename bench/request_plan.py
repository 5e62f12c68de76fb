"""The steps of a `bench.request_cpu` run, their names, and the ratios to serve read from
their figures."""

from __future__ import annotations

import functools
from typing import Any

# Which kinds of request run at which concurrency; `--targets` runs TARGET_PLAN.
Plan = dict[int, tuple[str, ...]]
KINDS = ("jobs", "chats", "streamed", "batch")
TARGET_PLAN: Plan = {16: ("streamed",), 64: KINDS, 256: ("jobs", "chats")}
# The kind of serve request each kind of inferq request is held against.
SERVE_KIND = {"jobs": "chats", "chats": "chats", "streamed": "streamed", "batch": "chats"}


def step_name(plan: Plan, side: str, kind: str, concurrency: int, turn: int | None = None) -> str:
    """`serve-chats`, `inferq-jobs`...; with `@<concurrency>` when the plan has several,
    and `#<turn>` when serve and inferq take turns (`--rounds`)."""
    name = f"{side}-{kind}" if len(plan) == 1 else f"{side}-{kind}@{concurrency}"
    return name if turn is None else f"{name}#{turn}"


OURS = ("api", "worker", "service", "postgres", "redis")


def summary(results: dict[str, Any], plan: Plan, rounds: int | None = None) -> list[str]:
    """Each inferq step's CPU per request beside the engine, and its ratios to serve; when
    they took turns, to the mean of serve's steps either side of it, then over every
    turn: all the tokens each side generated over all its seconds."""
    lines = []
    for turn in [None] if rounds is None else range(rounds):
        for concurrency, kinds in plan.items():
            for kind in kinds:
                ours = results.get(step_name(plan, "inferq", kind, concurrency, turn))
                serve = functools.partial(step_name, plan, "serve", SERVE_KIND[kind], concurrency)
                theirs = results.get(serve(turn))
                if not ours or not theirs:
                    continue
                if turn is not None:
                    theirs = _mean([theirs, results[serve(turn + 1)]])
                lines.append(_compared(kind, concurrency, ours, theirs, turn))
    if rounds is not None:
        for concurrency, kinds in plan.items():
            for kind in kinds:
                serve = functools.partial(step_name, plan, "serve", SERVE_KIND[kind], concurrency)
                ours = [
                    results[step_name(plan, "inferq", kind, concurrency, t)] for t in range(rounds)
                ]
                theirs = [results[serve(t)] for t in range(rounds + 1)]
                pooled = [
                    sum(s["generated_tokens"] for s in side) / sum(s["seconds"] for s in side)
                    for side in (ours, theirs)
                ]
                ratios = sorted(
                    o["tokens_per_s"] / _mean([theirs[t], theirs[t + 1]])["tokens_per_s"]
                    for t, o in enumerate(ours)
                )
                lines.append(
                    f"{kind} at {concurrency}, {rounds} turns: tokens/s {pooled[0]:.0f} vs "
                    f"{pooled[1]:.0f}: {pooled[0] / pooled[1]:.3f}x (turns: "
                    f"{', '.join(f'{r:.3f}' for r in ratios)})"
                )
        for side, other in (("serve", "inferq"), ("inferq", "serve")):
            steps = [v for k, v in results.items() if k.startswith(f"{side}-")]
            spent = sum(sum(v.get("idle_side_cpu_s", {}).values()) for v in steps)
            seconds = sum(v["seconds"] for v in steps)
            lines.append(
                f"{other}'s processes while {side}'s steps ran: {spent:.1f} s of CPU over "
                f"{seconds:.0f} s ({100 * spent / seconds:.1f}% of a core)"
            )
    return lines


def _mean(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Serve's figures that a ratio uses, averaged over `steps`."""
    return {
        "cpu_ms_per_request": {
            "front": sum(s["cpu_ms_per_request"]["front"] for s in steps) / len(steps)
        },
        "tokens_per_s": sum(s["tokens_per_s"] for s in steps) / len(steps),
    }


def _compared(
    kind: str, concurrency: int, ours: dict[str, Any], theirs: dict[str, Any], turn: int | None
) -> str:
    per = ours["cpu_ms_per_request"]
    total = sum(per[k] for k in OURS)
    serve_ms = theirs["cpu_ms_per_request"]["front"]
    parts = ", ".join(f"{k} {per[k]:.2f}" for k in OURS)
    line = (
        f"{kind} at {concurrency}{'' if turn is None else f' (turn {turn})'}: {total:.2f} ms "
        f"a request ({parts}) vs serve's front end {serve_ms:.2f} ms: "
        f"{total / serve_ms:.2f}x (target 1.5x); tokens/s {ours['tokens_per_s']:.0f} vs "
        f"{theirs['tokens_per_s']:.0f}: {ours['tokens_per_s'] / theirs['tokens_per_s']:.3f}x"
    )
    if kind == "streamed" and "ttft_p50_s" in theirs:
        line += (
            f"; TTFT p50 {1000 * ours['ttft_p50_s']:.0f} vs "
            f"{1000 * theirs['ttft_p50_s']:.0f} ms "
            f"(+{1000 * (ours['ttft_p50_s'] - theirs['ttft_p50_s']):.0f}); TPOT p50 "
            f"{ours['tpot_p50_s'] / theirs['tpot_p50_s']:.2f}x"
        )
    return line
