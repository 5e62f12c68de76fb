"""`inferq batch ...`: submit prompt files, watch them run, fetch their results."""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO, Annotated, Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from cli.client import ApiError, Client
from cli.prompt_files import Defaults, is_openai_batch, prepare
from inferq.constants import BATCH_ENDED_HEADER, NEXT_CURSOR_HEADER
from inferq.settings import Settings

batch_app = typer.Typer(no_args_is_help=True, help="Submit and follow batch files.")
TERMINAL = {"completed", "failed", "expired", "cancelled"}
console = Console(stderr=True)
# Headers of `GET /v1/batches/{id}/output` (see api/routes/batches.py).

UrlOption = Annotated[str | None, typer.Option(help="API base URL [env INFERQ_API_URL].")]
KeyOption = Annotated[
    str | None, typer.Option(help="API key.", envvar="INFERQ_API_KEY", show_envvar=True)
]

# Sampling for lines converted from plain text or {"prompt"}/{"messages"} objects.
ChatOption = Annotated[bool, typer.Option(help="Send plain-text prompts as chat.")]
MaxTokensOption = Annotated[int | None, typer.Option(help="For converted lines.")]
TemperatureOption = Annotated[float | None, typer.Option(help="For converted lines.")]
TopPOption = Annotated[float | None, typer.Option(help="For converted lines.")]
SeedOption = Annotated[int | None, typer.Option(help="For converted lines.")]


def sampling_defaults(
    *, max_tokens: int | None, temperature: float | None, top_p: float | None, seed: int | None
) -> dict[str, Any]:
    given = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "seed": seed}
    return {k: v for k, v in given.items() if v is not None}


def _client(url: str | None, api_key: str | None) -> Client:
    return Client(url or Settings().api_url, api_key=api_key)


@batch_app.command("submit")
def submit(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="The prompt file.")],
    wait: Annotated[bool, typer.Option(help="Follow it with a progress bar until done.")] = False,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="With --wait: write the results here.")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model of a converted file's lines (default: the only one served); an "
            "OpenAI Batch file's lines name their own."
        ),
    ] = None,
    chat: ChatOption = True,
    max_tokens: MaxTokensOption = None,
    temperature: TemperatureOption = None,
    top_p: TopPOption = None,
    seed: SeedOption = None,
    completion_window: Annotated[str, typer.Option(help="e.g. 24h, 90m.")] = "24h",
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Submit FILE as a batch: OpenAI Batch JSONL, JSONL of {"prompt"} or {"messages"}
    objects, or plain text with one prompt per line."""
    sampling = sampling_defaults(
        max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed
    )
    with _client(url, api_key) as client, tempfile.TemporaryDirectory() as workdir:
        if is_openai_batch(file):
            if given := _conversion_options(model, sampling):
                raise typer.BadParameter(
                    f"{file} is OpenAI Batch JSONL, whose lines carry their own model and "
                    f"sampling: drop {' and '.join(given)} (they are for converted files)"
                )
            served = ""  # nothing is converted
        else:
            served = model or _only_generation_model(client.get("/v1/models")["data"])
        ready = prepare(
            file, Defaults(model=served, sampling=sampling, chat=chat), workdir=Path(workdir)
        )
        uploaded = client.upload(ready.path)
        batch = client.post(
            "/v1/batches",
            {
                "input_file_id": uploaded["id"],
                "endpoint": ready.endpoint,
                "completion_window": completion_window,
            },
        )
    typer.echo(batch["id"])
    if batch["status"] == "failed":
        _print_errors(batch)
        raise typer.Exit(1)
    if wait:
        with _client(url, api_key) as client:
            batch = _follow(client, batch["id"])
            _finish(client, batch, output)


@batch_app.command("status")
def status(
    batch_id: Annotated[str, typer.Argument()], url: UrlOption = None, api_key: KeyOption = None
) -> None:
    """Show a batch: status, counts, files."""
    with _client(url, api_key) as client:
        batch = client.get(f"/v1/batches/{batch_id}")
    counts = batch["request_counts"]
    typer.echo(
        f"{batch['id']}  {batch['status']}  {counts['completed']} done, {counts['failed']} "
        f"failed of {counts['total']}  output={batch['output_file_id']}  "
        f"errors={batch['error_file_id']}"
    )
    if batch["status"] == "failed":
        _print_errors(batch)


@batch_app.command("cancel")
def cancel(
    batch_id: Annotated[str, typer.Argument()], url: UrlOption = None, api_key: KeyOption = None
) -> None:
    """Cancel a batch: finished lines are kept, the rest never run."""
    with _client(url, api_key) as client:
        batch = client.post(f"/v1/batches/{batch_id}/cancel")
    typer.echo(f"{batch['id']}  {batch['status']}")


@batch_app.command("list")
def list_batches(
    limit: Annotated[int, typer.Option(help="How many.")] = 20,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """List batches, newest first."""
    with _client(url, api_key) as client:
        page = client.get("/v1/batches", limit=limit)
    for batch in page["data"]:
        counts = batch["request_counts"]
        typer.echo(
            f"{batch['id']}  {batch['status']:<11}  {counts['completed']}/{counts['total']} "
            f"done  {counts['failed']} failed  {batch['endpoint']}"
        )


@batch_app.command("download")
def download(
    batch_id: Annotated[str, typer.Argument()],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write results.")],
    partial: Annotated[
        bool,
        typer.Option(
            help="Do not wait for the batch to end: append the lines ended since the last "
            "--partial run (which OUTPUT.cursor remembers)."
        ),
    ] = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Write a batch's results (and, beside them, its errors) to files."""
    with _client(url, api_key) as client:
        if partial:
            _append_partial(client, batch_id, output)
        else:
            _finish(client, client.get(f"/v1/batches/{batch_id}"), output)


@batch_app.command("follow")
def follow(
    batch_id: Annotated[str, typer.Argument()],
    output: Annotated[Path, typer.Option("-o", "--output", help="Results here, errors beside it.")],
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Write a batch's results to OUTPUT as they come, in input order (failed and
    cancelled lines to OUTPUT with .errors.jsonl), until it ends. Cut off, it reconnects
    and goes on; stopped, it goes on where it was when run again (OUTPUT.follow
    remembers; without it, OUTPUT is written from the start)."""
    state = _FollowState.resume(output)
    with _client(url, api_key) as client:
        batch = client.get(f"/v1/batches/{batch_id}")
        with (
            progress_bar() as progress,
            output.open("ab") as results,
            state.errors.open("ab") as errors,
        ):
            task = progress.add_task(
                batch_id,
                total=batch["request_counts"]["total"],
                completed=state.lines,
                failed=state.failed,
                rate=0.0,
            )
            while (ended := _follow_events(client, batch_id, state, results, errors)) is None:
                progress.update(task, completed=state.lines, failed=state.failed)
                time.sleep(RECONNECT_S)
            progress.update(task, completed=state.lines, failed=state.failed)
        _finish(client, ended, None)
    typer.echo(f"wrote {output} and {state.errors}", err=True)


# A lost connection is tried again this often, and given up after this many tries in a
# row that brought nothing.
RECONNECT_S = 1.0
RECONNECT_TRIES = 30


class _FollowState:
    """Where `batch follow` is: the last line written, and how long each file was then.
    Saved beside the output (`OUTPUT.follow`); a run that goes on cuts the files back to
    the saved lengths first, so a line written after the last save is not written twice."""

    def __init__(self, output: Path) -> None:
        self.output = output
        self.errors = output.with_suffix(".errors.jsonl")
        self.path = output.with_name(f"{output.name}.follow")
        self.cursor = 0
        self.lines = 0
        self.failed = 0
        self.sizes = (0, 0)
        self.tries = 0

    @classmethod
    def resume(cls, output: Path) -> _FollowState:
        state = cls(output)
        if state.path.exists():
            saved = json.loads(state.path.read_text())
            state.cursor, state.lines, state.failed = (
                saved["cursor"],
                saved["lines"],
                saved["failed"],
            )
            state.sizes = (saved["output_bytes"], saved["error_bytes"])
        for path, size in ((state.output, state.sizes[0]), (state.errors, state.sizes[1])):
            with path.open("ab") as file:
                file.truncate(size)
        return state

    def save(self, results: IO[bytes], errors: IO[bytes]) -> None:
        results.flush()
        errors.flush()
        self.sizes = (results.tell(), errors.tell())
        saved = {
            "cursor": self.cursor,
            "lines": self.lines,
            "failed": self.failed,
            "output_bytes": self.sizes[0],
            "error_bytes": self.sizes[1],
        }
        temporary = self.path.with_name(self.path.name + ".new")
        temporary.write_text(json.dumps(saved) + "\n")
        temporary.replace(self.path)


def _follow_events(
    client: Client, batch_id: str, state: _FollowState, results: IO[bytes], errors: IO[bytes]
) -> dict[str, Any] | None:
    """Write the lines the API sends from the cursor on; the batch once it has ended, or
    None if the connection was lost (try again)."""
    saved_at = time.monotonic()
    try:
        with client.events(
            f"/v1/batches/{batch_id}/output",
            last_event_id=str(state.cursor),
            follow="true",
            include="errors",
        ) as events:
            for event in events:
                if event.event == "end":
                    state.save(results, errors)
                    ended: dict[str, Any] = json.loads(event.data)
                    return ended
                if event.event != "line":
                    continue
                failed = json.loads(event.data)["error"] is not None
                (errors if failed else results).write(event.data.encode() + b"\n")
                state.cursor = int(event.id)
                state.lines += 1
                state.failed += failed
                state.tries = 0
                if time.monotonic() - saved_at > 0.5:
                    state.save(results, errors)
                    saved_at = time.monotonic()
    except ApiError as exc:
        if exc.status is not None or state.tries >= RECONNECT_TRIES:
            raise
        console.print(f"{exc.message}; going on from line {state.cursor}")
    state.save(results, errors)
    state.tries += 1
    return None


def progress_bar() -> Progress:
    """Lines done of total, failed lines, generated tokens/s, elapsed time and ETA."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TextColumn("{task.fields[rate]:.0f} tok/s"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console,
    )


def _follow(client: Client, batch_id: str) -> dict[str, Any]:
    with progress_bar() as progress:
        batch = client.get(f"/v1/batches/{batch_id}")
        task = progress.add_task(
            batch_id, total=batch["request_counts"]["total"], failed=0, rate=0.0
        )
        tokens, since = batch["usage"]["output_tokens"], time.monotonic()
        while batch["status"] not in TERMINAL:
            time.sleep(1)
            batch = client.get(f"/v1/batches/{batch_id}")
            counts, now = batch["request_counts"], time.monotonic()
            rate = (batch["usage"]["output_tokens"] - tokens) / max(now - since, 1e-6)
            tokens, since = batch["usage"]["output_tokens"], now
            progress.update(
                task,
                completed=counts["completed"] + counts["failed"],
                failed=counts["failed"],
                rate=rate,
                description=f"{batch_id} {batch['status']}",
            )
    return batch


def _finish(client: Client, batch: dict[str, Any], output: Path | None) -> None:
    counts = batch["request_counts"]
    typer.echo(
        f"batch {batch['id']} {batch['status']}: {counts['completed']} succeeded, "
        f"{counts['failed']} failed of {counts['total']}",
        err=True,
    )
    if output is None:
        return
    for file_id, target in (
        (batch["output_file_id"], output),
        (batch["error_file_id"], output.with_suffix(".errors.jsonl")),
    ):
        if file_id is None:
            continue
        with target.open("wb") as out:
            for chunk in client.download(file_id):
                out.write(chunk)
        typer.echo(f"wrote {target}", err=True)


def _append_partial(client: Client, batch_id: str, output: Path) -> None:
    """Append the batch's lines ended since the cursor kept beside `output`, as `_finish`
    writes them (successes to `output`, the others beside it), and move the cursor on."""
    cursor_file = output.with_name(f"{output.name}.cursor")
    after = int(cursor_file.read_text()) if cursor_file.exists() else 0
    errors = output.with_suffix(".errors.jsonl")
    added = {False: 0, True: 0}  # by whether the line is an error
    # Gathered before anything is appended, so a broken download appends nothing twice.
    with tempfile.TemporaryFile() as succeeded, tempfile.TemporaryFile() as failed:
        with client.stream(
            f"/v1/batches/{batch_id}/output", after=after, include="errors"
        ) as response:
            cursor = int(response.headers[NEXT_CURSOR_HEADER])
            ended = response.headers[BATCH_ENDED_HEADER] == "true"
            for line in response.iter_lines():
                if line:
                    error = json.loads(line)["error"] is not None
                    (failed if error else succeeded).write(line.encode() + b"\n")
                    added[error] += 1
        _append(succeeded, output)
        _append(failed, errors)
    cursor_file.write_text(f"{cursor}\n")
    typer.echo(
        f"added {added[False]} results to {output} and {added[True]} errors to {errors}; batch "
        f"{batch_id} {'has ended' if ended else 'is still running'} (line {cursor} reached)",
        err=True,
    )


def _append(lines: IO[bytes], target: Path) -> None:
    """Append the gathered `lines` to `target`, made only if there are some."""
    if not lines.tell():
        return
    lines.seek(0)
    with target.open("ab") as out:
        shutil.copyfileobj(lines, out)


def _print_errors(batch: dict[str, Any]) -> None:
    for error in (batch.get("errors") or {}).get("data", []):
        typer.echo(f"  {error['message']}", err=True)


def _conversion_options(model: str | None, sampling: dict[str, Any]) -> list[str]:
    """The options given that only converted lines take."""
    given = ["--model"] if model is not None else []
    return given + [f"--{name.replace('_', '-')}" for name in sampling]


def _only_generation_model(models: list[dict[str, Any]]) -> str:
    """The model converted lines go to when `--model` is not given: the only one."""
    names = [
        m["id"] for m in models if m.get("runner", "generate") == "generate" and not m.get("parent")
    ]
    if len(names) != 1:
        served = ", ".join(names) or "none yet (start a GPU worker)"
        raise typer.BadParameter(f"give --model: this deployment serves {served}")
    return str(names[0])
