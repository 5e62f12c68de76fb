"""MkDocs hooks: pages made from what the code and the repository say, when the site is
built, so they cannot go stale. `<!-- front-page -->` becomes README.md (its links into the
docs made relative to them); `<!-- openapi -->` the API reference, from the OpenAPI
document the API serves; `<!-- bench-results -->` bench/RESULTS.md (its headings one level
down, its links to raw result files as paths)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "<!-- front-page -->" in markdown:
        markdown = markdown.replace("<!-- front-page -->", _front_page())
    if "<!-- openapi -->" in markdown:
        markdown = markdown.replace("<!-- openapi -->", _api_reference())
    if "<!-- bench-results -->" in markdown:
        markdown = markdown.replace("<!-- bench-results -->", _results())
    return markdown


def _front_page() -> str:
    text = (ROOT / "README.md").read_text()
    text = text.replace("](bench/RESULTS.md)", "](benchmarks.md#the-results)")
    return text.replace("](docs/", "](")


def _results() -> str:
    text = (ROOT / "bench" / "RESULTS.md").read_text()
    text = re.sub(r"^(#+) ", r"#\1 ", text, flags=re.MULTILINE)
    # Raw result files and pages of the repository are not part of the site.
    return re.sub(r"\[([^\]]+)\]\((?!https?:)([^)#]+)[^)]*\)", r"\1 (`bench/\2`)", text)


def _api_reference() -> str:
    from api.main import create_app

    spec = create_app().openapi()
    sections: dict[str, list[str]] = {}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            tag = (operation.get("tags") or ["other"])[0]
            sections.setdefault(tag, []).append(_operation(spec, path, method, operation))
    out = []
    for tag in sorted(sections):
        out += [f"## {tag.capitalize()}", "", *sections[tag]]
    return "\n".join(out)


def _operation(spec: dict[str, Any], path: str, method: str, operation: dict[str, Any]) -> str:
    lines = [f"### `{method.upper()} {path}`", "", operation.get("description", "").strip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        lines += ["| parameter | in | type | meaning |", "|---|---|---|---|"]
        for parameter in parameters:
            schema = parameter.get("schema", {})
            meaning = parameter.get("description") or schema.get("description", "")
            if not meaning and parameter["in"] == "path":
                # {job_id} and its kind: the id its create call (or list) gave.
                meaning = f"The {parameter['name'].removesuffix('_id').replace('_', ' ')}'s id."
            lines.append(
                f"| `{parameter['name']}` | {parameter['in']} | {_type(schema)} "
                f"| {_cell(meaning)} |"
            )
        lines.append("")
    body = operation.get("requestBody", {}).get("content", {})
    for media, content in body.items():
        schema = _resolve(spec, content.get("schema", {}))
        lines += [f"Body ({media}):", ""]
        lines += _properties(spec, schema)
    lines += ["| answer | when |", "|---|---|"]
    for code, answer in operation.get("responses", {}).items():
        when = _cell(answer.get("description", ""))
        lines.append(f"| `{code}` | {'Done.' if when == 'Successful Response' else when} |")
    return "\n".join([*lines, ""])


def _properties(spec: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    properties = schema.get("properties")
    if not properties:
        return [f"{_type(schema)}", ""]
    required = set(schema.get("required", []))
    rows = ["| field | type | meaning |", "|---|---|---|"]
    for name, written in properties.items():
        field = _resolve(spec, written)
        mark = " (required)" if name in required else ""
        meaning = _cell(field.get("description", ""))
        rows.append(f"| `{name}`{mark} | {_type(field)} | {meaning} |")
    return [*rows, ""]


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = spec
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return dict(node)


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return " or ".join(_type(option) for option in schema[key])
    kind = schema.get("type", "object")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if "enum" in schema:
        return " \\| ".join(f"`{value}`" for value in schema["enum"])
    return str(kind)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
