"""Prompt files in the shapes people have, turned into OpenAI Batch input lines.

Three shapes are read, told apart by the first non-blank line:

- OpenAI Batch JSONL (`custom_id`, `method`, `url`, `body`): used as it is;
- JSONL of `{"prompt": ...}` or `{"messages": [...]}` objects, with optional `custom_id`
  and per-line sampling fields;
- plain text: one prompt per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferq.domain.batches import CHAT_ENDPOINT, COMPLETIONS_ENDPOINT, ENDPOINTS
from inferq.exceptions import InvalidRequest

MAX_LISTED_PROBLEMS = 100


class BadInput(InvalidRequest):
    """The file cannot be run as it is; `problems` says why, a line each."""

    def __init__(self, problems: list[str]) -> None:
        shown = problems[:MAX_LISTED_PROBLEMS]
        if len(problems) > len(shown):
            shown.append(f"... and {len(problems) - len(shown)} more")
        super().__init__("\n".join(shown))
        self.problems = shown


@dataclass(frozen=True, kw_only=True)
class Defaults:
    """What converted lines get unless they say otherwise."""

    model: str
    sampling: dict[str, Any] = field(default_factory=dict)
    chat: bool = True


@dataclass(frozen=True)
class InputFile:
    """An input file ready to submit: its path (converted if need be) and its endpoint."""

    path: Path
    endpoint: str
    lines: int


def is_openai_batch(source: Path) -> bool:
    """Whether `source` is OpenAI Batch JSONL already (its lines name their own models)."""
    return _is_batch_line(_json_object(_first_line(source)))


def _is_batch_line(parsed: dict[str, Any] | None) -> bool:
    return parsed is not None and {"custom_id", "body"} <= set(parsed)


def prepare(source: Path, defaults: Defaults, *, workdir: Path) -> InputFile:
    """Return `source` itself if it is already OpenAI Batch JSONL, else a converted copy."""
    first = _first_line(source)
    parsed = _json_object(first)
    if parsed is not None and _is_batch_line(parsed):
        url = parsed.get("url")
        if url not in ENDPOINTS:
            raise BadInput([f"{source}: line 1 has url {url!r}, not a batch endpoint"])
        return InputFile(source, str(url), _count_lines(source))
    target = workdir / f"{source.stem}.batch.jsonl"
    if parsed is not None:
        chat = "messages" in parsed
        lines = _write(target, _from_objects(source, defaults, chat=chat))
    else:
        chat = defaults.chat
        lines = _write(target, _from_text(source, defaults))
    return InputFile(target, CHAT_ENDPOINT if chat else COMPLETIONS_ENDPOINT, lines)


def _from_objects(source: Path, defaults: Defaults, *, chat: bool) -> Iterator[dict[str, Any]]:
    """The converted lines; every line that cannot be converted is named at the end."""
    kind = "messages" if chat else "prompt"
    problems = []
    for number, raw in _numbered(source):
        item = _json_object(raw)
        if item is None:
            problems.append(f"{source}: line {number} is not a JSON object")
            continue
        if kind not in item:
            problems.append(
                f"{source}: line {number} has no {kind!r} (the file's first line has one; "
                "a file is all prompts or all chats)"
            )
            continue
        custom_id = str(item.pop("custom_id", None) or item.pop("id", None) or f"line-{number}")
        body = {"model": defaults.model, **defaults.sampling, **item}
        yield _line(custom_id, body, chat=chat)
    if problems:
        raise BadInput(problems)


def _from_text(source: Path, defaults: Defaults) -> Iterator[dict[str, Any]]:
    for number, raw in _numbered(source):
        prompt = raw.rstrip("\r")
        body: dict[str, Any] = (
            {"messages": [{"role": "user", "content": prompt}]}
            if defaults.chat
            else {"prompt": prompt}
        )
        yield _line(
            f"line-{number}",
            {"model": defaults.model, **defaults.sampling, **body},
            chat=defaults.chat,
        )


def _line(custom_id: str, body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT_ENDPOINT if chat else COMPLETIONS_ENDPOINT,
        "body": body,
    }


def _write(target: Path, lines: Iterator[dict[str, Any]]) -> int:
    count = 0
    with target.open("w", encoding="utf-8") as out:
        for line in lines:
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            count += 1
    if not count:
        raise BadInput(["the file has no prompts"])
    return count


def _numbered(source: Path) -> Iterator[tuple[int, str]]:
    try:
        with source.open(encoding="utf-8-sig") as handle:
            for number, raw in enumerate(handle, start=1):
                if raw.strip():
                    yield number, raw.rstrip("\n")
    except UnicodeDecodeError as exc:
        raise BadInput([f"{source} is not valid UTF-8 ({exc.reason} at byte {exc.start})"]) from exc


def _first_line(source: Path) -> str:
    for _, raw in _numbered(source):
        return raw
    raise BadInput([f"{source} is empty"])


def _count_lines(source: Path) -> int:
    return sum(1 for _ in _numbered(source))


def _json_object(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):  # the line's own check says why, per line
        return None
    return value if isinstance(value, dict) else None
