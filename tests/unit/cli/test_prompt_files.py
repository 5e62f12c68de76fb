"""Prompt files in every accepted shape become OpenAI Batch lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.prompt_files import Defaults, prepare
from inferq.exceptions import InvalidRequest

DEFAULTS = Defaults(model="tiny", sampling={"max_tokens": 5})


def _lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_openai_batch_files_are_used_as_they_are(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}
    source.write_text(json.dumps(line) + "\n\n" + json.dumps({**line, "custom_id": "b"}) + "\n")
    ready = prepare(source, DEFAULTS, workdir=tmp_path)
    assert ready.path == source
    assert ready.endpoint == "/v1/completions"
    assert ready.lines == 2


def test_plain_text_becomes_chat_lines(tmp_path: Path) -> None:
    source = tmp_path / "prompts.txt"
    source.write_text("\ufeffFirst prompt\n\n  second one\r\n")
    ready = prepare(source, DEFAULTS, workdir=tmp_path / "")
    assert ready.endpoint == "/v1/chat/completions"
    lines = _lines(ready.path)
    assert [line["custom_id"] for line in lines] == ["line-1", "line-3"]
    assert lines[0]["body"] == {
        "model": "tiny",
        "max_tokens": 5,
        "messages": [{"role": "user", "content": "First prompt"}],
    }
    raw = prepare(source, Defaults(model="tiny", chat=False), workdir=tmp_path)
    assert raw.endpoint == "/v1/completions"
    assert _lines(raw.path)[1]["body"] == {"model": "tiny", "prompt": "  second one"}


def test_prompt_objects_keep_their_ids_and_settings(tmp_path: Path) -> None:
    source = tmp_path / "prompts.jsonl"
    source.write_text(
        json.dumps({"prompt": "a", "custom_id": "mine", "max_tokens": 9})
        + "\n"
        + json.dumps({"prompt": "b"})
        + "\n"
    )
    ready = prepare(source, DEFAULTS, workdir=tmp_path)
    first, second = _lines(ready.path)
    assert ready.endpoint == "/v1/completions"
    assert first["custom_id"] == "mine"
    assert first["body"] == {"model": "tiny", "max_tokens": 9, "prompt": "a"}
    assert second["custom_id"] == "line-2"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"\n  \n", "is empty"),
        (
            b'{"messages": [{"role": "user", "content": "a"}]}\n{"prompt": "b"}\n',
            "line 2 has no 'messages'",
        ),
        (b"ok\n\xff\xfe\n", "not valid UTF-8"),
        (
            b'{"custom_id": "a", "method": "POST", "url": "/v1/moderations", "body": {}}\n',
            "not a batch endpoint",
        ),
    ],
)
def test_bad_files_say_what_is_wrong(tmp_path: Path, content: bytes, message: str) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_bytes(content)
    with pytest.raises(InvalidRequest, match=message):
        prepare(source, DEFAULTS, workdir=tmp_path)
