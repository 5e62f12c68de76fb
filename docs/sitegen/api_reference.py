"""The API reference, from the OpenAPI document the API serves: the answers every route
shares once, then each route (parameters, body, answers), then every schema a route takes
or returns, each field with its type, default, range and meaning."""

from __future__ import annotations

import json
from typing import Any

# Error statuses that any /v1 route may answer with, described once at the top.
SHARED = ("401", "422", "429", "503")
# The order of the route sections; a tag not named here comes after them.
TAGS = (
    "jobs",
    "completions",
    "responses",
    "embeddings",
    "files",
    "batches",
    "models",
    "webhooks",
    "usage",
    "status",
    "admin",
    "health",
)


def api_reference(spec: dict[str, Any]) -> str:
    sections: dict[str, list[str]] = {}
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            tag = (operation.get("tags") or ["other"])[0]
            sections.setdefault(tag, []).append(_operation(path, method, operation))
    out = _shared(spec)
    for tag in sorted(sections, key=lambda t: (TAGS.index(t) if t in TAGS else len(TAGS), t)):
        out += [f"## {tag.capitalize()}", "", *sections[tag]]
    out += ["## Schemas", "", "Every object a route takes or returns, by name.", ""]
    for name, schema in sorted(spec["components"]["schemas"].items()):
        out += _schema(name, schema)
    return "\n".join(out)


def _shared(spec: dict[str, Any]) -> list[str]:
    described: dict[str, str] = {}
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for operation in operations.values():
            for code, answer in operation.get("responses", {}).items():
                if code in SHARED:
                    described.setdefault(code, answer.get("description", ""))
    rows = [
        "## Answers every route shares",
        "",
        "Besides its own answers below, any `/v1` route can answer with these; the body is",
        "an [`ErrorBody`](#errorbody), and the [error page](../errors.md) lists every `code`.",
        "",
        "| status | when |",
        "|---|---|",
    ]
    rows += [f"| `{code}` | {_cell(described[code])} |" for code in SHARED if code in described]
    return [*rows, ""]


def _operation(path: str, method: str, operation: dict[str, Any]) -> str:
    lines = [f"### `{method.upper()} {path}`", "", operation.get("description", "").strip(), ""]
    parameters = operation.get("parameters", [])
    if parameters:
        rows = []
        for parameter in parameters:
            schema = parameter.get("schema", {})
            meaning = parameter.get("description") or schema.get("description", "")
            if not meaning and parameter["in"] == "path":
                # {job_id} and its kind: the id its create call (or list) gave.
                meaning = f"The {parameter['name'].removesuffix('_id').replace('_', ' ')}'s id."
            required = " (required)" if parameter.get("required") else ""
            rows.append(
                [
                    f"`{parameter['name']}`{required}",
                    parameter["in"],
                    _type(schema),
                    _default(schema),
                    _range(schema),
                    _cell(meaning),
                ]
            )
        lines += _table(["parameter", "in", "type", "default", "range", "meaning"], rows)
    for media, content in operation.get("requestBody", {}).get("content", {}).items():
        lines += [f"Takes ({media}) {_type(content.get('schema', {}))}.", ""]
    lines += ["| answer | what |", "|---|---|"]
    for code, answer in operation.get("responses", {}).items():
        if code in SHARED:
            continue
        lines.append(f"| `{code}` | {_answer(code, answer)} |")
    return "\n".join([*lines, ""])


def _answer(code: str, answer: dict[str, Any]) -> str:
    description = answer.get("description", "")
    if description == "Successful Response":
        description = ""
    content = answer.get("content", {})
    returns = []
    for media, body in content.items():
        schema = body.get("schema", {})
        if media == "application/json" and schema:
            returns.append(_type(schema))
        else:
            returns.append(f"`{media}`")
    if code.startswith("2") and returns:
        what = " or ".join(returns)
        return _cell(f"{description} Returns {what}." if description else f"Returns {what}.")
    return _cell(description)


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    out = [f"### {name} {{#{name.lower()}}}", ""]
    if description := schema.get("description"):
        out += [_cell(description), ""]
    properties = schema.get("properties")
    if not properties:
        if "enum" in schema:
            out += [f"One of {_type(schema)}.", ""]
        return out
    required = set(schema.get("required", []))
    rows = [
        [
            f"`{field}`" + (" (required)" if field in required else ""),
            _type(written),
            _default(written),
            _range(written),
            _cell(written.get("description", "")),
        ]
        for field, written in properties.items()
    ]
    return [*out, *_table(["field", "type", "default", "range", "meaning"], rows)]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table without the columns that are empty in every row."""
    kept = [i for i in range(len(header)) if i == 0 or any(row[i] for row in rows)]
    lines = ["| " + " | ".join(header[i] for i in kept) + " |", "|" + "---|" * len(kept)]
    lines += ["| " + " | ".join(row[i] for i in kept) + " |" for row in rows]
    return [*lines, ""]


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{name.lower()})"
    for key in ("anyOf", "oneOf"):
        if key in schema:
            options = [o for o in schema[key] if o.get("type") != "null"]
            written = " or ".join(_type(option) for option in options)
            nullable = len(options) < len(schema[key])
            return f"{written} or null" if nullable else written
    if "const" in schema or "enum" in schema:
        return ", ".join(f"`{json.dumps(v)}`" for v in schema.get("enum", [schema.get("const")]))
    return _container(schema)


def _container(schema: dict[str, Any]) -> str:
    kind = schema.get("type", "any")
    if kind == "array":
        return f"array of {_type(schema.get('items', {}))}"
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(schema['additionalProperties'])}"
    return str(kind)


def _default(schema: dict[str, Any]) -> str:
    if "default" not in schema:
        return ""
    return _cell(f"`{json.dumps(schema['default'])}`")


_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
    ("maxProperties", "at most {} pairs"),
)


def _range(schema: dict[str, Any]) -> str:
    """Bounds of the value, of its one non-null branch where it may be null."""
    branches = [o for o in schema.get("anyOf", [schema]) if o.get("type") != "null"]
    bounds = []
    for branch in branches:
        for key, form in _BOUNDS:
            if key in branch:
                value = branch[key]
                number = int(value) if isinstance(value, float) and value.is_integer() else value
                bounds.append(form.format(number))
    return _cell(", ".join(dict.fromkeys(bounds)))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")
