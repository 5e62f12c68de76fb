"""The error page's tables: every code the code can answer with (error_codes.py), what it
means (error_codes.toml), and every HTTP status the API answers errors with."""

from __future__ import annotations

import tomllib
from pathlib import Path

from .error_codes import http_statuses, raised_codes

MEANINGS = Path(__file__).with_name("error_codes.toml")
# The exception the `openai` client raises for each status (openai-python's `_client.py`).
OPENAI_EXCEPTIONS = {
    401: "AuthenticationError",
    403: "PermissionDeniedError",
    404: "NotFoundError",
    409: "ConflictError",
    413: "APIStatusError",
    422: "UnprocessableEntityError",
    429: "RateLimitError",
    500: "InternalServerError",
    503: "InternalServerError",
}
_GROUPS = (
    ("Answers to a request", lambda met: met[0].isdigit()),
    ("A job's or a batch line's error", lambda met: met[0] in ("job", "batch line")),
    ("The error event that ends a stream", lambda met: met[0] == "stream"),
)


def problems() -> list[str]:
    """What keeps the page from telling the truth: codes without a meaning, meanings
    without a code, and statuses the code answers with that a meaning leaves out."""
    meanings = tomllib.loads(MEANINGS.read_text())
    found = raised_codes()
    wrong = [
        f"{code}: raised by the code, but not in {MEANINGS.name}"
        for code in sorted(found.keys() - meanings.keys())
    ]
    wrong += [
        f"{code}: in {MEANINGS.name}, but nothing in the code raises it"
        for code in sorted(meanings.keys() - found.keys())
    ]
    for code, statuses in sorted(http_statuses(found).items()):
        missing = {str(s) for s in statuses} - set(meanings.get(code, {}).get("met", ()))
        if code in meanings and missing:
            wrong.append(f"{code}: answered with {', '.join(sorted(missing))}, not in its `met`")
    return wrong


def error_codes_markdown() -> str:
    """One table per place a client meets a code, a row per code."""
    if wrong := problems():
        raise ValueError("docs/errors.md cannot be made:\n" + "\n".join(wrong))
    meanings = tomllib.loads(MEANINGS.read_text())
    out: list[str] = []
    for title, belongs in _GROUPS:
        codes = [code for code in sorted(meanings) if belongs(meanings[code]["met"])]
        out += [f"### {title}", "", "| code | met as | cause | what to do |", "|---|---|---|---|"]
        for code in codes:
            meaning = meanings[code]
            met = ", ".join(f"`{m}`" if m.isdigit() else m for m in meaning["met"])
            out.append(
                f'| <span id="{code}"></span>`{code}` | {met} | {meaning["cause"]} '
                f"| {meaning['fix']} |"
            )
        out.append("")
    return "\n".join(out)


def statuses_markdown() -> str:
    """Every status the API answers errors with, as its OpenAPI document describes them."""
    from api.errors import error_responses

    described = error_responses(*sorted(s for s in OPENAI_EXCEPTIONS if s != 500))
    when = {int(status): entry["description"] for status, entry in described.items()}
    when[500] = "An online request's job failed; the `code` is the job's."
    rows = ["| status | `openai` raises | when |", "|---|---|---|"]
    rows += [f"| `{s}` | `{OPENAI_EXCEPTIONS[s]}` | {when[s]} |" for s in sorted(when)]
    return "\n".join(rows)
