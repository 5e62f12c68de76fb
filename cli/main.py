"""The `inferq` command: start the services, migrate, and submit work."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Annotated, Any

import httpx
import typer

from cli.batch import batch_app
from cli.keys import keys_app
from cli.logs import configure_logging, configured
from cli.run import run
from cli.usage import usage
from inferq.settings import Settings

if TYPE_CHECKING:
    from pydantic import ValidationError

    from inferq.domain.served_models import ServedModel

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_show_locals=False
)
app.add_typer(keys_app, name="keys")
health_app = typer.Typer(no_args_is_help=True, help="Health checks (for compose and probes).")
app.add_typer(health_app, name="health")
app.add_typer(batch_app, name="batch")
app.command("run")(run)
app.command("usage")(usage)


@app.command()
def api() -> None:
    """Serve the HTTP API (uvicorn)."""
    import uvicorn

    from inferq.store.migrate import check_schema

    settings = configured()
    check_schema(settings.database_url)
    uvicorn.run(
        "api.main:create_app",
        factory=True,
        host=settings.api_host,
        port=settings.api_port,
        workers=settings.api_workers,
        log_level=settings.log_level.lower(),
        timeout_keep_alive=settings.api_keep_alive_s,
        # With JSON logs, uvicorn's records go through inferq's handler instead of its own.
        log_config=None if settings.log_json else uvicorn.config.LOGGING_CONFIG,
    )


@app.command()
def worker(
    name: Annotated[str | None, typer.Option(help="Worker name (default gpu-PID@HOST).")] = None,
) -> None:
    """Run a GPU worker: load the model once, then drain the queues into it."""
    from worker.main import run_worker

    run_worker(configured(), name=name)


@app.command()
def webhooks(
    name: Annotated[str | None, typer.Option(help="Worker name.")] = None,
) -> None:
    """Run the housekeeper (no GPU): webhook deliveries, the maintenance pass, batch endings."""
    from housekeeper.main import run_housekeeper

    run_housekeeper(configured(), name=name)


@app.command()
def beat() -> None:
    """Schedule periodic maintenance (run exactly one)."""
    from housekeeper.main import run_beat

    run_beat(configured())


@app.command()
def flower() -> None:
    """Serve Flower (the Celery monitor) with basic auth; refuses to start without it."""
    from inferq.broker.celery_app import make_celery

    settings = configured()
    if settings.flower_basic_auth is None:
        typer.echo(
            "Flower shows every job's arguments, so it only starts with authentication: "
            "set INFERQ_FLOWER_BASIC_AUTH=user:password",
            err=True,
        )
        raise typer.Exit(2)
    make_celery(settings).start(
        [
            "flower",
            f"--port={settings.flower_port}",
            f"--basic-auth={settings.flower_basic_auth.get_secret_value()}",
            "--purge-offline-workers=60",
            # The task's argument is the list of job ids: show it in the task list.
            "--tasks-columns=name,args,state,received,runtime,worker",
        ]
    )


@app.command()
def migrate(
    revision: Annotated[str, typer.Argument(help="Target revision.")] = "head",
    announce_model: Annotated[
        bool,
        typer.Option(
            help="Then make INFERQ_MODEL's names known, as its worker does when it starts, so "
            "the API queues their work before any worker is up (compose's `migrate` does)."
        ),
    ] = False,
) -> None:
    """Create or upgrade the database schema (alembic upgrade head), then make the models of
    INFERQ_ANNOUNCE_MODELS known."""
    from inferq.domain.served_models import announced_by, served_by
    from inferq.store.migrate import upgrade

    settings = configured()
    upgrade(settings.database_url, revision)
    typer.echo(f"database schema is at {revision}")
    models = announced_by(settings) + (served_by(settings) if announce_model else [])
    if models:
        _announce(settings, models)


def _announce(settings: Settings, models: list[ServedModel]) -> None:
    from inferq.store.database import make_database, make_sessions
    from inferq.store.served_models import ModelStore

    # A name listed twice (in INFERQ_ANNOUNCE_MODELS and as INFERQ_MODEL's) is announced
    # once, as the setting says.
    unique: dict[str, ServedModel] = {}
    for model in models:
        unique.setdefault(model.name, model)
    engine = make_database(settings.database_url, pool_size=1)
    try:
        announced = ModelStore(make_sessions(engine)).announce(list(unique.values()))
    finally:
        engine.dispose()
    if announced:
        typer.echo(f"announced: {', '.join(announced)}")
        return
    names = list(unique)
    known = f"{names[0]} is" if len(names) == 1 else f"{', '.join(names)} are"
    typer.echo(f"announced: none new ({known} known already)")


@health_app.command("worker")
def health_worker(
    name: Annotated[str, typer.Argument(help="Worker name; %h is this host's name.")],
) -> None:
    """Exit 0 if the Celery worker NAME answers a ping within 5 s."""
    import socket

    from inferq.broker.celery_app import make_celery

    target = name.replace("%h", socket.gethostname())
    replies = make_celery(configured()).control.ping(destination=[target], timeout=5)
    if not any(target in reply for reply in replies or ()):
        typer.echo(f"worker {target} did not answer", err=True)
        raise typer.Exit(1)
    typer.echo(f"worker {target} is up")


@health_app.command("maintenance")
def health_maintenance() -> None:
    """Exit 0 if maintenance ran within three intervals (beat and its worker both work)."""
    from datetime import UTC, datetime

    from redis import Redis

    from inferq.constants import MAINTENANCE_LAST_RUN_KEY

    settings = configured()
    raw = Redis.from_url(settings.redis_url).get(
        settings.redis_key_prefix + MAINTENANCE_LAST_RUN_KEY
    )
    if raw is None:
        typer.echo("maintenance has not run yet", err=True)
        raise typer.Exit(1)
    last_run = raw.decode() if isinstance(raw, bytes) else str(raw)
    age_s = (datetime.now(UTC) - datetime.fromisoformat(last_run)).total_seconds()
    if age_s > 3 * settings.maintenance_interval_s + 5:
        typer.echo(f"maintenance last ran {age_s:.0f} s ago", err=True)
        raise typer.Exit(1)
    typer.echo(f"maintenance ran {age_s:.0f} s ago")


@app.command()
def doctor() -> None:
    """Check this host: Postgres, Redis, workers, the model, GPUs, memory, ports.

    One line per check; each failing line says how to fix it. Exit status 1 if any fails.
    """
    from pydantic import ValidationError

    from cli.doctor import run_checks

    try:
        settings = Settings()
    except ValidationError as exc:
        typer.echo(f"FAIL  {'settings':<10} {_settings_problems(exc)}")
        raise typer.Exit(1) from exc
    configure_logging("ERROR", json_lines=False)
    for chatty in ("huggingface_hub", "transformers"):  # retries of a download, say
        logging.getLogger(chatty).setLevel(logging.ERROR)
    failed = False
    for check in run_checks(settings):
        failed |= not check.ok
        typer.echo(f"{'ok' if check.ok else 'FAIL':<5} {check.name:<10} {check.detail}")
    if failed:
        raise typer.Exit(1)


@app.command("settings")
def show_settings(
    markdown: Annotated[bool, typer.Option(help="Print the table of all settings.")] = False,
) -> None:
    """Print the settings in effect (passwords hidden), or all of them as a table."""
    from inferq.settings import settings_table

    if markdown:
        typer.echo(settings_table())
        return
    from inferq.settings import redact_url

    for name, value in Settings().model_dump().items():
        shown = redact_url(value) if isinstance(value, str) else value
        typer.echo(f"INFERQ_{name.upper()}={shown}")


@app.command()
def submit(
    prompt: Annotated[str, typer.Argument(help="The prompt.")],
    chat: Annotated[bool, typer.Option(help="Send as a user chat message.")] = False,
    model: Annotated[
        str | None, typer.Option(help="Model to run it (default: the only one served).")
    ] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Most tokens to generate.")] = None,
    temperature: Annotated[float | None, typer.Option(help="Sampling temperature.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed.")] = None,
    wait: Annotated[bool, typer.Option(help="Wait for the result and print it.")] = False,
    timeout: Annotated[float, typer.Option(help="Seconds to wait at most.")] = 600,
    url: Annotated[str | None, typer.Option(help="API base URL [env INFERQ_API_URL].")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="API key.", envvar="INFERQ_API_KEY", show_envvar=True)
    ] = None,
) -> None:
    """Submit one prompt; with --wait, print the generated text."""
    base = url or Settings().api_url
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body: dict[str, Any] = (
        {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    )
    given = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "seed": seed}
    for key, value in given.items():
        if value is not None:
            body[key] = value
    try:
        with httpx.Client(base_url=base, timeout=timeout + 30, headers=headers) as client:
            job = _check(client.post("/v1/jobs", json=body))
            if not wait:
                typer.echo(job["id"])
                return
            job = _await_job(client, job["id"], timeout)
    except httpx.HTTPError as exc:
        typer.echo(f"cannot reach the inferq API at {base}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if job["status"] != "succeeded":
        error = job.get("error") or {}
        typer.echo(f"job {job['id']} {job['status']}: {error.get('message', '')}", err=True)
        raise typer.Exit(1)
    for choice in job["choices"]:
        typer.echo(choice["text"])


def _await_job(client: httpx.Client, job_id: str, timeout: float) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        job = _check(client.get(f"/v1/jobs/{job_id}", params={"wait": max(0, min(left, 60))}))
        if job["status"] in {"succeeded", "failed", "cancelled"} or left <= 0:
            return job


def _check(response: httpx.Response) -> dict[str, Any]:
    if response.is_error:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        typer.echo(f"error {response.status_code}: {message}", err=True)
        raise typer.Exit(2)
    data: dict[str, Any] = response.json()
    return data


def main() -> None:
    from pydantic import ValidationError

    from inferq.exceptions import InferqError

    try:
        app(prog_name="inferq")
    except InferqError as exc:
        # Expected at start-up (database missing or behind, port taken): say what to do.
        typer.echo(f"inferq: {exc.message}", err=True)
        raise SystemExit(2) from exc
    except ValidationError as exc:
        typer.echo(f"inferq: invalid settings: {_settings_problems(exc)}", err=True)
        raise SystemExit(2) from exc


def _settings_problems(exc: ValidationError) -> str:
    return "; ".join(
        f"INFERQ_{'_'.join(map(str, e['loc'])).upper() or '*'}: {e['msg']}" for e in exc.errors()
    )


if __name__ == "__main__":
    main()
