"""Storing any text the engine accepts, NUL included, and giving it back unchanged.

PostgreSQL's `text` and `jsonb` cannot hold U+0000, which prompts and model outputs may
contain. Every user string is stored with two characters escaped: `ESCAPE` becomes
`ESCAPE + "1"` and NUL becomes `ESCAPE + "0"` (`ESCAPE` is a private-use code point, so
almost no text holds it). The escape is applied where values cross into the database:
`StoredText` for text columns, `dumps`/`loads` as the engine's JSON serializer (every
JSON column, and the bulk COPY path in `inferq.store.bulk`); nothing above the store sees
an escaped string. JSON goes through pydantic-core, which keeps integers past 64 bits
exact."""

from __future__ import annotations

import re
from typing import Any

import pydantic_core
from sqlalchemy import Dialect, Text
from sqlalchemy.types import TypeDecorator

ESCAPE = "\U0010fffd"
_ESCAPE_BYTES = ESCAPE.encode()
_ESCAPED = re.compile(ESCAPE + "([01])")
_UNESCAPED = {"0": "\x00", "1": ESCAPE}


def escape(text: str) -> str:
    """`text` with NUL and `ESCAPE` replaced by what Postgres can hold."""
    if "\x00" not in text and ESCAPE not in text:
        return text
    return text.replace(ESCAPE, ESCAPE + "1").replace("\x00", ESCAPE + "0")


def escape_optional(text: str | None) -> str | None:
    """`escape` for a nullable column."""
    return None if text is None else escape(text)


def unescape(text: str) -> str:
    """The text `escape` was given."""
    if ESCAPE not in text:
        return text
    return _ESCAPED.sub(lambda found: _UNESCAPED[found.group(1)], text)


def dumps(value: Any) -> str:
    """JSON for a JSON column, every string in it (keys too) escaped."""
    encoded = pydantic_core.to_json(value)
    # NUL is written \u0000 and ESCAPE as it is: one scan each finds both absent.
    if b"\\u0000" in encoded or _ESCAPE_BYTES in encoded:
        encoded = pydantic_core.to_json(_map_strings(value, escape))
    return encoded.decode()


def loads(encoded: str | bytes) -> Any:
    """The value `dumps` was given."""
    value = pydantic_core.from_json(encoded)
    present = _ESCAPE_BYTES in encoded if isinstance(encoded, bytes) else ESCAPE in encoded
    return _map_strings(value, unescape) if present else value


def _map_strings(value: Any, change: Any) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {
            change(key) if isinstance(key, str) else key: _map_strings(item, change)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_map_strings(item, change) for item in value]
    return value


class StoredText(TypeDecorator[str]):
    """A text column that holds any string: `escape`d on the way in, `unescape`d out."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, _dialect: Dialect) -> str | None:
        return escape_optional(value)

    def process_result_value(self, value: str | None, _dialect: Dialect) -> str | None:
        return None if value is None else unescape(value)
