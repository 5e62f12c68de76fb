"""`inferq batch ...`: submit prompt files, watch them run, fetch their results."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.batch_results import append_partial, describe_estimate, finish, follow_to, progress_bar
from cli.client import Client
from cli.prompt_files import Defaults, is_openai_batch, prepare
from inferq.settings import Settings

batch_app = typer.Typer(no_args_is_help=True, help="Submit and follow batch files.")
TERMINAL = {"completed", "failed", "expired", "cancelled"}

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
    estimate: Annotated[
        bool,
        typer.Option(
            "--estimate", help="Only say when it would end and what it would cost: queue nothing."
        ),
    ] = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Submit FILE as a batch: OpenAI Batch JSONL, JSONL of {"prompt"} or {"messages"}
    objects, or plain text with one prompt per line. Says when it is expected to end."""
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
        body = {
            "input_file_id": uploaded["id"],
            "endpoint": ready.endpoint,
            "completion_window": completion_window,
        }
        if estimate:
            try:
                reply = client.post("/v1/batch-estimates", body)
            finally:
                client.delete(f"/v1/files/{uploaded['id']}")
            _print_errors(reply)
            typer.echo(f"{reply['lines']} lines: {describe_estimate(reply['estimate'])}")
            raise typer.Exit(1 if reply["errors"] else 0)
        batch = client.post("/v1/batches", body)
    typer.echo(batch["id"])
    if batch["status"] == "failed":
        _print_errors(batch)
        raise typer.Exit(1)
    typer.echo(describe_estimate(batch.get("estimate")), err=True)
    if wait:
        with _client(url, api_key) as client:
            batch = _follow(client, batch["id"])
            finish(client, batch, output)


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
    elif batch["status"] not in TERMINAL:
        typer.echo(f"  {describe_estimate(batch.get('estimate'))}")


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
            append_partial(client, batch_id, output)
        else:
            finish(client, client.get(f"/v1/batches/{batch_id}"), output)


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
    with _client(url, api_key) as client:
        follow_to(client, batch_id, output)


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
