"""MkDocs hooks: pages made from what the code and the repository say, when the site is
built, so they cannot go stale. `<!-- front-page -->` becomes README.md (its links into the
docs made relative to them); `<!-- openapi -->` the API reference, from the OpenAPI
document the API serves; `<!-- error-statuses -->` and `<!-- error-codes -->` the error
page's tables, from the code (sitegen/); `<!-- compatibility -->` the compatibility page's
tables, from the request models; `<!-- bench-results -->` bench/RESULTS.md (less its
title, its links to raw result files as paths)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sitegen.api_reference import api_reference
from sitegen.errors_page import error_codes_markdown, statuses_markdown

ROOT = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, **_: Any) -> str:
    makers = {
        "<!-- front-page -->": _front_page,
        "<!-- openapi -->": _api_reference,
        "<!-- error-statuses -->": statuses_markdown,
        "<!-- error-codes -->": error_codes_markdown,
        "<!-- compatibility -->": _compatibility,
        "<!-- bench-results -->": _results,
    }
    for marker, make in makers.items():
        if marker in markdown:
            markdown = markdown.replace(marker, make())
    return markdown


def _front_page() -> str:
    text = (ROOT / "README.md").read_text()
    text = text.replace("](bench/RESULTS.md)", "](benchmarks.md)")
    text = re.sub(r"\]\(bench/RESULTS\.md#", "](benchmarks.md#", text)
    # A results file is not part of the site: its name stands as it is.
    text = re.sub(r"\[([^\]]+)\]\(bench/results/[^)]+\)", r"`\1`", text)
    text = text.replace("](LICENSE)", "](https://www.apache.org/licenses/LICENSE-2.0)")
    return text.replace("](docs/", "](")


def _results() -> str:
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    text = text.split("\n", 1)[1]  # its title: the page has its own
    # Raw result files and pages of the repository are not part of the site: their paths
    # stand in for the links.
    return re.sub(r"\[([^\]]+)\]\((?!https?:|#)([^)#]+)[^)]*\)", _as_path, text)


def _as_path(link: re.Match[str]) -> str:
    text, path = (
        link[1],
        (Path("bench") / link[2]).as_posix() + ("/" if link[2].endswith("/") else ""),
    )
    if text.strip("`").rstrip("/") in (path, link[2].rstrip("/"), Path(link[2]).name):
        return f"`{path}`"
    return f"{text} (`{path}`)"


def _compatibility() -> str:
    from sitegen.compat_page import compatibility_markdown  # imports the request models

    return compatibility_markdown()


def _api_reference() -> str:
    from api.main import create_app

    return api_reference(create_app().openapi())
