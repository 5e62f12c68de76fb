"""A batch's results written to files: once it has ended (`finish`), the lines ended since
the last call (`append_partial`), or as they end, followed live (`follow_to`)."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

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
from inferq.constants import BATCH_ENDED_HEADER, NEXT_CURSOR_HEADER

console = Console(stderr=True)


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


def follow_to(client: Client, batch_id: str, output: Path) -> None:
    """Write the batch's lines to `output` (errors beside it) as they end, until it ends;
    going on where an earlier call stopped."""
    state = _FollowState.resume(output)
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

        def tick() -> None:
            state.save(results, errors, only_if_changed=True)
            progress.update(task, completed=state.lines, failed=state.failed)

        # Saved and shown every half second from a thread of its own, so that lines that
        # came in a burst are in the files (and on the bar) while the stream is quiet.
        with _every(SAVE_EVERY_S, tick):
            while (ended := _follow_events(client, batch_id, state, results, errors)) is None:
                time.sleep(RECONNECT_S)
    finish(client, ended, None)
    typer.echo(f"wrote {output} and {state.errors}", err=True)


# A lost connection is tried again this often, and given up after this many tries in a
# row that brought nothing.
RECONNECT_S = 1.0
RECONNECT_TRIES = 30
SAVE_EVERY_S = 0.5


@contextlib.contextmanager
def _every(interval_s: float, call: Callable[[], None]) -> Iterator[None]:
    """`call` every `interval_s` in a thread while the block runs, and once after it."""
    done = threading.Event()

    def run() -> None:
        while not done.wait(interval_s):
            call()

    thread = threading.Thread(target=run, name="follow-saver", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        call()


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
        # Held while a line is written and while the files are saved.
        self.lock = threading.Lock()
        self.changed = False

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

    def save(self, results: IO[bytes], errors: IO[bytes], *, only_if_changed: bool = False) -> None:
        """Flush the files and record the place (under `lock`: the follow and the saver's
        thread both call it)."""
        with self.lock:
            if only_if_changed and not self.changed:
                return
            self._save(results, errors)
            self.changed = False

    def _save(self, results: IO[bytes], errors: IO[bytes]) -> None:
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
                with state.lock:
                    (errors if failed else results).write(event.data.encode() + b"\n")
                    state.cursor = int(event.id)
                    state.lines += 1
                    state.failed += failed
                    state.tries = 0
                    state.changed = True
    except ApiError as exc:
        if exc.status is not None or state.tries >= RECONNECT_TRIES:
            raise
        console.print(f"{exc.message}; going on from line {state.cursor}")
    state.save(results, errors)
    state.tries += 1
    return None


def finish(client: Client, batch: dict[str, Any], output: Path | None) -> None:
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


def append_partial(client: Client, batch_id: str, output: Path) -> None:
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


def describe_estimate(estimate: dict[str, Any] | None) -> str:
    """A batch's estimate (`BatchEstimatePublic`) in a line."""
    if estimate is None:
        return "no estimate yet: no worker of its model has measured its speed"
    now = time.time()

    def at(key: str) -> str:
        when = datetime.fromtimestamp(estimate[key]).astimezone()
        return f"{when:%H:%M:%S} (in {_span(estimate[key] - now)})"

    return (
        f"expected to end at {at('completion_at')}, by {at('latest_completion_at')} at the "
        f"latest; {estimate['input_tokens']:,} prompt tokens, about "
        f"{estimate['output_tokens']:,} output tokens (at most {estimate['output_tokens_max']:,}) "
        f"at {estimate['tokens_per_s']:,.0f} tokens/s, after {estimate['tokens_ahead']:,} "
        "tokens queued before it"
    )


def _span(seconds: float) -> str:
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {seconds:02d}s"
