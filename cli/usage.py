"""`inferq usage`: a tenant's tokens and requests from the API's `/v1/usage`, as a table or
as CSV."""

from __future__ import annotations

import csv
import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli.batch import KeyOption, UrlOption
from cli.client import ApiError, Client
from inferq.settings import Settings

COLUMNS = (
    ("input_tokens", "input"),
    ("output_tokens", "output"),
    ("embedding_tokens", "embedding"),
    ("num_model_requests", "requests"),
    ("jobs", "jobs"),
    ("batch_lines", "batch lines"),
    ("batches", "batches"),
)
GROUPS = ("model", "api_key_id", "tenant")


def usage(
    start: Annotated[
        datetime | None,
        typer.Option(help="From (UTC) [the last 7 days, or 24 hours with --hourly]."),
    ] = None,
    end: Annotated[datetime | None, typer.Option(help="To (UTC) [now].")] = None,
    hourly: Annotated[bool, typer.Option(help="Buckets of an hour, not a day.")] = False,
    group_by: Annotated[
        str | None,
        typer.Option(help="Comma-separated: model, api_key_id, tenant (admins)."),
    ] = None,
    tenant: Annotated[
        str | None, typer.Option(help="Admins: one tenant's usage [every tenant's].")
    ] = None,
    as_csv: Annotated[bool, typer.Option("--csv", help="Write CSV to standard output.")] = False,
    url: UrlOption = None,
    api_key: KeyOption = None,
) -> None:
    """Tokens and requests by day (or hour), model, API key and tenant."""
    params: dict[str, Any] = {
        "bucket_width": "1h" if hourly else "1d",
        "start_time": _unix(start),
        "end_time": _unix(end),
        "group_by": group_by,
        "tenant": tenant,
    }
    try:
        with Client(url or Settings().api_url, api_key=api_key) as client:
            buckets = _buckets(client, params)
    except ApiError as exc:
        typer.echo(f"inferq: {exc.message}", err=True)
        raise typer.Exit(1) from exc
    groups = [g for g in GROUPS if g in (group_by or "").split(",")]
    rows = [
        [_when(bucket["start_time"], hourly), *(result[g] or "" for g in groups)]
        + [result[name] for name, _ in COLUMNS]
        for bucket in buckets
        for result in bucket["results"]
    ]
    when = "hour" if hourly else "day"
    if as_csv:
        writer = csv.writer(sys.stdout)
        writer.writerow([when, *groups, *(name for name, _ in COLUMNS)])
        writer.writerows(rows)
        return
    table = Table(
        when,
        *groups,
        *(title for _, title in COLUMNS),
        title="usage (tokens: input, output, embedding; UTC)",
    )
    for row in rows:
        table.add_row(*(f"{v:,}" if isinstance(v, int) else str(v) for v in row))
    Console().print(table)


def _buckets(client: Client, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every bucket, page after page."""
    buckets: list[dict[str, Any]] = []
    page: str | None = None
    while True:
        answer = client.get("/v1/usage", **params, page=page)
        buckets += answer["data"]
        page = answer.get("next_page")
        if not answer.get("has_more") or page is None:
            return buckets


def _unix(moment: datetime | None) -> int | None:
    if moment is None:
        return None
    return int((moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp())


def _when(unix_s: int, hourly: bool) -> str:
    moment = datetime.fromtimestamp(unix_s, UTC)
    return moment.strftime("%Y-%m-%d %H:00" if hourly else "%Y-%m-%d")
