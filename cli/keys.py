"""`inferq keys`: API keys, their rate limits and quotas, in the database directly (an
admin with a key does the same through `/v1/admin/keys`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.logs import configured
from inferq.settings import ConnectionSettings

if TYPE_CHECKING:
    from inferq.domain.api_keys import ApiKey
    from inferq.store.api_keys import KeyStore

INT64 = 2**63 - 1  # what the quota columns hold

keys_app = typer.Typer(
    no_args_is_help=True, help="Create, list, update and revoke API keys: limits and quotas."
)


def _key_store(settings: ConnectionSettings) -> KeyStore:
    from inferq.store.api_keys import KeyStore
    from inferq.store.database import make_database, make_sessions

    return KeyStore(make_sessions(make_database(settings.database_url, pool_size=1)))


@keys_app.command("create")
def keys_create(
    name: Annotated[str, typer.Option(help="A name for the key (who or what uses it).")],
    tenant: Annotated[
        str | None, typer.Option(help="Tenant whose data the key sees (default: the name).")
    ] = None,
    admin: Annotated[bool, typer.Option(help="See and manage every tenant's data.")] = False,
    rpm: Annotated[int | None, typer.Option(help="Requests per minute (0: unlimited).")] = None,
    tpm: Annotated[int | None, typer.Option(help="Job tokens per minute (0: unlimited).")] = None,
) -> None:
    """Create an API key and print it. It is shown this once: only its hash is kept."""
    key, secret = _key_store(configured()).create(
        name=name, tenant=tenant, admin=admin, rpm=rpm, tpm=tpm
    )
    typer.echo(secret)
    role = "admin" if key.admin else f"tenant {key.tenant}"
    typer.echo(f"created {key.id} ({key.name}, {role}); keep the key above safe", err=True)


@keys_app.command("list")
def keys_list() -> None:
    """List API keys (never their secrets), with their limits and quotas."""
    for key in _key_store(configured()).list():
        typer.echo(_key_line(key))


@keys_app.command("update")
def keys_update(
    key_id: Annotated[str, typer.Argument(help="The key's id (key_...).")],
    rpm: Annotated[int | None, typer.Option(help="Requests per minute (0: unlimited).")] = None,
    tpm: Annotated[int | None, typer.Option(help="Job tokens per minute (0: unlimited).")] = None,
    max_queued_tokens: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=INT64,
            help="Quota: tokens queued or running at once, prompt plus max_tokens (0: none).",
        ),
    ] = None,
    daily_tokens: Annotated[
        int | None,
        typer.Option(min=0, max=INT64, help="Quota: tokens a UTC day, used plus queued (0: none)."),
    ] = None,
    weight: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=1000,
            help="Its tenant's share of batch work against other tenants' (default 1).",
        ),
    ] = None,
) -> None:
    """Change a key's limits, quotas and weight (those not given stay as they are). The API
    applies limits and quotas within INFERQ_AUTH_CACHE_S; a weight counts from the next
    claim of batch lines."""
    from inferq.exceptions import NotFound

    given = {
        "rpm": rpm,
        "tpm": tpm,
        "max_queued_tokens": max_queued_tokens,
        "daily_tokens": daily_tokens,
        "weight": weight,
    }
    changes = {name: value for name, value in given.items() if value is not None}
    if not changes:
        typer.echo(
            "nothing to change: give --rpm, --tpm, --max-queued-tokens, --daily-tokens or --weight"
        )
        raise typer.Exit(2)
    try:
        key = _key_store(configured()).update(key_id, **changes)
    except NotFound as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(1) from exc
    typer.echo(_key_line(key))


def _key_line(key: ApiKey) -> str:
    state = "active" if key.active else f"revoked {key.revoked_at:%Y-%m-%d %H:%M}"
    limits = f"rpm={key.rpm if key.rpm is not None else 'default'} "
    limits += f"tpm={key.tpm if key.tpm is not None else 'default'}"
    quota = key.quota
    limits += f" max_queued_tokens={quota.max_queued_tokens or 'none'}"
    limits += f" daily_tokens={quota.daily_tokens or 'none'} weight={key.weight}"
    role = "admin" if key.admin else "tenant"
    return f"{key.id}  {key.prefix}...  {key.name}  {role}:{key.tenant}  {limits}  {state}"


@keys_app.command("revoke")
def keys_revoke(key_id: Annotated[str, typer.Argument(help="The key's id (key_...).")]) -> None:
    """Revoke an API key; requests with it are refused from then on."""
    from inferq.exceptions import NotFound

    try:
        key = _key_store(configured()).revoke(key_id)
    except NotFound as exc:
        typer.echo(exc.message, err=True)
        raise typer.Exit(1) from exc
    typer.echo(f"revoked {key.id} ({key.name})")
