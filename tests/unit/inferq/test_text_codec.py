"""What the store does to text Postgres cannot hold (NUL), and that it undoes it exactly."""

from __future__ import annotations

import pytest

from inferq.store import text_codec
from inferq.store.text_codec import ESCAPE

TEXTS = [
    "",
    "plain",
    "a\x00b",
    "\x00\x00",
    ESCAPE,
    ESCAPE + "0",
    ESCAPE + "1",
    f"\x00{ESCAPE}0\x00",
]


@pytest.mark.parametrize("text", TEXTS)
def test_escaped_text_holds_no_nul_and_reads_back_exactly(text: str) -> None:
    stored = text_codec.escape(text)
    assert "\x00" not in stored
    assert text_codec.unescape(stored) == text


def test_text_without_nul_or_the_escape_is_stored_as_it_is() -> None:
    assert text_codec.escape("héllo \\u0000 wörld") == "héllo \\u0000 wörld"
    assert text_codec.dumps({"a": ["b", 1, None]}) == '{"a":["b",1,null]}'


def test_json_values_hold_no_nul_in_strings_or_keys_and_read_back_exactly() -> None:
    value = {f"k\x00{ESCAPE}": [*TEXTS, 1, 2.5, None, True, {"inner\x00": "x\x00"}]}
    stored = text_codec.dumps(value)
    assert "\\u0000" not in stored
    assert text_codec.loads(stored) == value
    assert text_codec.loads(stored.encode()) == value
