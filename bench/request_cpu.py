"""What a request costs in CPU beside the engine: inferq's processes against
`vllm serve`'s front end, on the real engine and the same prompts, in one run.

    python -m bench.request_cpu [--requests 1000] [--concurrency 64] [--profile DIR]
    python -m bench.request_cpu --targets      # the whole plan: 16, 64 and 256 in flight

Serve's front end is its API server process (HTTP, chat template, tokenizer, detokenizer
and output handling); its engine core runs in processes under it. inferq's side is every
process but the engine's: the API, the GPU worker's own process (the engine loop with
vLLM's output handling, Celery, admission, the writer; its engine core runs in processes
under it, as serve's), the delivery worker and beat, Postgres and Redis. Both from
`/proc`, before and after each step. Steps, `--concurrency` requests in flight:
- serve-chats, serve-streamed: chat completions, not streamed and streamed;
- inferq-jobs (`POST /v1/jobs?wait=`), inferq-chats, inferq-streamed: the same;
- inferq-batch: the same requests as one batch file, from upload to the output read.
Prints each step's CPU per request and its ratio to serve's front end for the same kind
of request (batch lines and jobs: to serve's non-streamed chats), and the tokens/s ratio.
The API's and the GPU worker's CPU are also given per thread, named by `py-spy dump`
where py-spy is installed.
`--targets` runs the whole plan instead of every step at one concurrency: streamed chats
at 16 (the first-token target there), every step at 64, single jobs and chats at 256 (the
throughput target there); each step's name then ends in `@<concurrency>`.
`--kinds jobs,chats` runs only those kinds of request (and serve's that they are held
against).
`--profile DIR` records the API and the GPU worker with py-spy during inferq's steps
(samples of threads that hold the GIL: where Python spends CPU).
`--rounds N` keeps both up at once and has them take turns N times, each turn every
concurrency's serve step, then inferq's (serve's steps once more at the end): each
inferq step is held against the mean of serve's steps either side of it, and over all
turns, all of each side's tokens over all its seconds. A host whose speed drifts (by 10%
within minutes, seen here) then moves both sides of a ratio alike. Each step starts once
the other side is quiet (vLLM's engine spins for about a second after its last request),
and records what the other side spent while it ran (`idle_side_cpu_s`).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from bench import drive, stack, workload
from bench.compare import engine_args, inferq_env, run_inferq_batch
from bench.peers import SERVED, served
from bench.pipeline import CpuMeter, ThreadMeter, by_name, profiled
from bench.request_plan import KINDS, SERVE_KIND, TARGET_PLAN, Plan, step_name, summary
from bench.streaming import chat_figures, stream_figures
from cli.demo_model import BENCH
from inferq.host.processes import descendants

ENGINE_COMMS = ("VLLM::EngineCor", "VLLM::Worker")


def _is_engine(pid: int) -> bool:
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return False
    return comm.startswith(ENGINE_COMMS)


def front(pid: int) -> Callable[[], list[int]]:
    """`pid` and its descendants, less the engine's processes and theirs."""

    def pids() -> list[int]:
        engine = {p for e in descendants(pid) if e != pid and _is_engine(e) for p in descendants(e)}
        return [p for p in descendants(pid) if p not in engine]

    return pids


def engine(pid: int) -> Callable[[], list[int]]:
    """The engine's processes under `pid`."""

    def pids() -> list[int]:
        return [p for e in descendants(pid) if e != pid and _is_engine(e) for p in descendants(e)]

    return pids


@contextmanager
def measured(
    meter: CpuMeter, results: dict[str, Any], step: str, threads: ThreadMeter | None = None
) -> Iterator[dict[str, Any]]:
    """The block's figures (it fills the dict it is given) with the CPU each group spent,
    and each named thread of `threads`'s processes."""
    figures: dict[str, Any] = {}
    meter.start()
    if threads is not None:
        threads.start()
    yield figures
    cpu = meter.stop()
    requests = figures["requests"]
    results[step] = {
        **figures,
        "cpu_s": cpu,
        "cpu_ms_per_request": {k: 1000 * v / requests for k, v in cpu.items()},
    }
    if threads is not None:
        results[step]["thread_ms_per_request"] = {
            process: {name: round(1000 * v / requests, 3) for name, v in named.items()}
            for process, named in threads.stop().items()
        }
    print(step, json.dumps(results[step]), flush=True)


# A side's step: `step(kind, concurrency, turn)` runs that kind of request, records it
# and returns its name.
Step = Callable[[str, int, "int | None"], str]


class Side(NamedTuple):
    """A system up and warm: its step, and a meter of its processes (to see what it
    spends while the other side's step runs)."""

    step: Step
    meter: CpuMeter


def serve_kinds(kinds: tuple[str, ...]) -> list[str]:
    """The kinds of serve request that inferq's `kinds` are held against, in run order."""
    wanted = {SERVE_KIND[k] for k in kinds}
    return [kind for kind in ("chats", "streamed") if kind in wanted]


def our_kinds(kinds: tuple[str, ...]) -> list[str]:
    """inferq's `kinds`, in run order."""
    return [kind for kind in KINDS if kind in kinds]


@contextmanager
def serve_side(
    engine_settings: dict[str, Any],
    bodies: list[dict[str, Any]],
    *,
    plan: Plan,
    workdir: Path,
    results: dict[str, Any],
) -> Iterator[Side]:
    """`vllm serve`, up and warm until the block ends."""
    with served(engine_settings, workdir) as (server, url):
        groups = {"front": lambda: [server.pid], "engine": engine(server.pid)}
        meter = CpuMeter(groups)
        threads = ThreadMeter({"front": server.pid})
        warm = max(plan)
        chat_figures(url, bodies[:warm], concurrency=warm, api_key=None)

        def step(kind: str, concurrency: int, turn: int | None) -> str:
            figures_of = chat_figures if kind == "chats" else stream_figures
            name = step_name(plan, "serve", kind, concurrency, turn)
            with measured(meter, results, name, threads) as figures:
                figures.update(figures_of(url, bodies, concurrency=concurrency, api_key=None))
            return name

        yield Side(step, CpuMeter(groups))


@contextmanager
def inferq_side(
    model: Path,
    engine_settings: dict[str, Any],
    bodies: list[dict[str, Any]],
    *,
    plan: Plan,
    workdir: Path,
    profile: Path | None,
    results: dict[str, Any],
) -> Iterator[Side]:
    """inferq's deployment, up and warm until the block ends."""
    batch_file = workdir / "batch.jsonl"
    batch_file.write_text(
        "".join(
            json.dumps(
                {"custom_id": f"r{i}", "method": "POST", "url": workload.CHAT_URL, "body": body}
            )
            + "\n"
            for i, body in enumerate(bodies)
        )
    )
    with stack.deployment(model, workdir, **inferq_env(engine_settings)) as running:
        worker = running.worker.popen.pid
        groups = {
            "api": lambda: descendants(running.api.popen.pid),
            "worker": front(worker),
            "service": lambda: [
                *descendants(running.service.popen.pid),
                *descendants(running.beat.popen.pid),
            ],
            "postgres": lambda: by_name("postgres"),
            "redis": lambda: by_name("redis-server"),
            "engine": engine(worker),
        }
        meter = CpuMeter(groups)
        url = running.url
        warm = max(plan)
        drive.inferq_jobs(url, bodies[:warm], concurrency=warm)

        def call(kind: str, concurrency: int) -> dict[str, Any]:
            if kind == "jobs":
                return drive.inferq_jobs(url, bodies, concurrency=concurrency)
            if kind == "batch":
                return run_inferq_batch(url, batch_file)
            figures_of = chat_figures if kind == "chats" else stream_figures
            return figures_of(url, bodies, concurrency=concurrency, api_key=stack.ADMIN_KEY)

        pids = {"api": running.api.popen.pid, "worker": worker}
        threads = ThreadMeter(pids)

        def step(kind: str, concurrency: int, turn: int | None) -> str:
            name = step_name(plan, "inferq", kind, concurrency, turn)
            with (
                profiled(pids, profile, name),
                measured(meter, results, name, threads) as figures,
            ):
                figures.update(call(kind, concurrency))
            return name

        yield Side(step, CpuMeter(groups))


# The other side is quiet once its processes spend less than this share of a core
# (vLLM's engine spins for about a second after its last request).
QUIET_SHARE = 0.05
QUIET_WINDOW_S = 0.5
QUIET_WAIT_S = 30.0


def _settled(meter: CpuMeter) -> None:
    """Returns once `meter`'s processes are quiet (or after `QUIET_WAIT_S`)."""
    deadline = time.monotonic() + QUIET_WAIT_S
    while time.monotonic() < deadline:
        meter.start()
        time.sleep(QUIET_WINDOW_S)
        if sum(meter.stop().values()) < QUIET_SHARE * QUIET_WINDOW_S:
            return


def _run(
    results: dict[str, Any],
    side: Side,
    kinds: list[str],
    concurrency: int,
    *,
    turn: int | None,
    idle: Side | None = None,
) -> None:
    """`side`'s steps of `kinds`, with what `idle` (the other side) spent meanwhile, each
    once `idle` has gone quiet."""
    for kind in kinds:
        if idle is not None:
            _settled(idle.meter)
            idle.meter.start()
        name = side.step(kind, concurrency, turn)
        if idle is not None:
            results[name]["idle_side_cpu_s"] = idle.meter.stop()
            print(name, "idle side", json.dumps(results[name]["idle_side_cpu_s"]), flush=True)


def run_steps(
    serve: Callable[[], AbstractContextManager[Side]],
    ours: Callable[[], AbstractContextManager[Side]],
    *,
    plan: Plan,
    rounds: int | None,
    skip: set[str],
    results: dict[str, Any],
) -> None:
    """Serve's steps, then inferq's; or, with `rounds`, both up at once taking turns,
    each step recording what the other side spent meanwhile (`idle_side_cpu_s`)."""
    if rounds is None:
        for start, name, kinds_of in ((serve, "serve", serve_kinds), (ours, "inferq", our_kinds)):
            if name not in skip:
                with start() as side:
                    for concurrency, kinds in plan.items():
                        _run(results, side, kinds_of(kinds), concurrency, turn=None)
        return
    with serve() as theirs, ours() as mine:
        for turn in range(rounds + 1):
            for concurrency, kinds in plan.items():
                _run(results, theirs, serve_kinds(kinds), concurrency, turn=turn, idle=mine)
                if turn < rounds:
                    _run(results, mine, our_kinds(kinds), concurrency, turn=turn, idle=theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--targets", action="store_true", help="the whole plan (see above)")
    parser.add_argument("--model", type=Path, default=None, help="default: the bench model")
    parser.add_argument("--gpu", action="store_true", help="the reference GPU settings")
    parser.add_argument("--skip", default="", help="serve and/or inferq")
    parser.add_argument("--kinds", default="", help=f"only these of {','.join(KINDS)}")
    parser.add_argument("--profile", type=Path, help="record py-spy profiles here")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="both up at once, taking turns N times (serve's steps first and last); each "
        "inferq step is held against the mean of serve's steps either side of it",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/request-cpu.json"))
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    from transformers import AutoTokenizer

    model = args.model or stack.demo_model(BENCH, "bench")
    settings = engine_args(model, gpu=args.gpu)
    tokenizer = AutoTokenizer.from_pretrained(model)
    requests = workload.bulk(tokenizer, args.requests, context=settings["max_model_len"])
    bodies = [workload.body(r, SERVED) for r in requests]
    workdir = args.out.parent / "work-request-cpu"
    workdir.mkdir(parents=True, exist_ok=True)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    plan: Plan = TARGET_PLAN if args.targets else {args.concurrency: KINDS}
    if args.kinds:
        kinds = tuple(args.kinds.split(","))
        plan = {c: tuple(k for k in ks if k in kinds) for c, ks in plan.items()}
        plan = {c: ks for c, ks in plan.items() if ks}
    results: dict[str, Any] = {"requests": args.requests, "plan": plan}
    started = time.time()
    serve = functools.partial(
        serve_side, settings, bodies, plan=plan, workdir=workdir, results=results
    )
    ours = functools.partial(
        inferq_side,
        model,
        settings,
        bodies,
        plan=plan,
        workdir=workdir,
        profile=args.profile,
        results=results,
    )
    run_steps(serve, ours, plan=plan, rounds=args.rounds, skip=skip, results=results)
    results["wall_s"] = time.time() - started
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(["", *summary(results, plan, args.rounds)]))


if __name__ == "__main__":
    main()
