"""`inferq run FILE`: process a prompt file on this machine, nothing else installed."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from cli.batch import (
    ChatOption,
    MaxTokensOption,
    SeedOption,
    TemperatureOption,
    TopPOption,
    sampling_defaults,
)
from cli.batch_results import console, progress_bar
from cli.demo_model import DEMO
from cli.logs import configure_logging
from cli.prompt_files import BadInput, Defaults, prepare
from inferq.domain.batches import BatchStatus
from inferq.settings import Settings

if TYPE_CHECKING:
    from cli.local_run import LocalRun, Progress

EXIT_INTERRUPTED = 130


def run(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The prompt file.")],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Results, as OpenAI Batch output [FILE.output.jsonl]."),
    ] = None,
    state: Annotated[
        Path | None,
        typer.Option(help="State file (SQLite) that makes the run resumable [OUTPUT.state]."),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model id or path [env INFERQ_MODEL]; `demo` builds a small local model "
            "with random weights (NOT a real model) that runs anywhere."
        ),
    ] = None,
    chat: ChatOption = True,
    max_tokens: MaxTokensOption = None,
    temperature: TemperatureOption = None,
    top_p: TopPOption = None,
    seed: SeedOption = None,
) -> None:
    """Run every line of FILE here, with embedded SQLite and an in-process queue.

    FILE is OpenAI Batch JSONL, JSONL of {"prompt"} or {"messages"} objects, or plain text
    with one prompt per line. Interrupted (Ctrl-C, or killed), the same command resumes:
    lines already done are skipped.
    """
    from cli.local_run import LocalRun, local_settings

    settings = Settings()
    configure_logging("WARNING", json_lines=settings.log_json)
    # The progress bar is the output here; vLLM's start-up chatter is not.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    output = output or file.with_name(file.stem + ".output.jsonl")
    state = state or output.with_name(output.name + ".state")
    if model == DEMO:
        console.print(
            "[yellow]demo model[/]: random weights, NOT a real language model; its text is "
            "noise. It shows inferq working; use --model for real output."
        )
    settings = local_settings(settings, model)
    sampling = sampling_defaults(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
    )
    local = LocalRun(settings, state=state)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            try:
                ready = prepare(
                    file,
                    Defaults(model=settings.model_name, sampling=sampling, chat=chat),
                    workdir=Path(workdir),
                )
            except BadInput as exc:
                _refuse(file, exc.problems)
            batch = local.open_batch(ready.path, endpoint=ready.endpoint, name=file.name)
        if batch.status is BatchStatus.FAILED:
            _refuse(file, [error.message for error in batch.errors])
        _run(local, batch.id, state=state, model=settings.model_name)
        results, errors = local.write_results(batch.id, output)
        done = local.progress(batch.id)
    finally:
        local.close()
    typer.echo(f"results: {results or '(no line succeeded)'}", err=True)
    if errors is not None:
        typer.echo(f"errors:  {errors}", err=True)
    if done.failed:
        raise typer.Exit(1)


def _refuse(file: Path, problems: list[str]) -> NoReturn:
    for problem in problems:
        typer.echo(f"  {problem}", err=True)
    typer.echo(f"inferq: {file} has lines that cannot run; nothing ran", err=True)
    raise typer.Exit(1)


def _run(local: LocalRun, batch_id: str, *, state: Path, model: str) -> None:
    stop = threading.Event()

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        console.print("stopping: lines in flight go back to the queue (Ctrl-C again to quit now)")
        stop.set()
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    previous = signal.signal(signal.SIGINT, interrupt)
    signal.signal(signal.SIGTERM, interrupt)
    first = local.progress(batch_id)
    console.print(f"loading {model} ...")
    loading = time.monotonic()
    engine = local.load_engine()
    # The rate counts from here: a GPU engine's start (compiling, capturing CUDA graphs)
    # can take longer than the lines themselves, and says nothing of their pace.
    started = time.monotonic()
    console.print(f"loaded in {started - loading:.1f} s")
    with progress_bar() as bar:
        task = bar.add_task("run", total=first.total, completed=first.done, failed=0, rate=0.0)

        def show(now: Progress) -> None:
            elapsed = max(time.monotonic() - started, 1e-6)
            rate = (now.output_tokens - first.output_tokens) / elapsed
            bar.update(task, completed=now.done, failed=now.failed, rate=rate)

        finished = local.run(batch_id, engine=engine, stop=stop, on_progress=show)
    signal.signal(signal.SIGINT, previous)
    last = local.progress(batch_id)
    wall = time.monotonic() - started
    tokens = last.output_tokens - first.output_tokens
    console.print(
        f"{last.succeeded} succeeded, {last.failed} failed of {last.total} lines "
        f"({last.done - first.done} this run); {tokens} tokens generated in {wall:.1f} s "
        f"after loading ({tokens / max(wall, 1e-6):.0f} tok/s)"
    )
    if not finished:
        console.print(f"interrupted: run the same command again to resume (state: {state})")
        raise typer.Exit(EXIT_INTERRUPTED)
