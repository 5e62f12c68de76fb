"""The guide's examples run as written against the running stack: each `curl` block in a
shell (failing on an error answer), each Python block (the `openai` client's) in a namespace
its page shares, with the stack's address, an admin key for `KEY` and the tiny model for the
model the docs name. An example that cannot run here says why, in a comment before it
(`<!-- example: not run (why) -->`); one that shows an error says so
(`<!-- example: fails -->`). A doc example that stops working fails here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from tests.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[3]
GUIDE = sorted((ROOT / "docs" / "guide").glob("*.md"))
DOCS_MODEL = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
BLOCK = re.compile(r"(?:<!-- example: ([^>]*?) -->\n)?```(sh|python)\n(.*?)```", re.S)


def _blocks(page: Path) -> list[tuple[str | None, str, str]]:
    """(marker, language, code) of each shell and Python block of a page, in order."""
    return BLOCK.findall(page.read_text())


def _as_here(code: str, stack: Stack) -> str:
    host = stack.url.removeprefix("http://")
    return (
        code.replace("http://localhost:8000", stack.url)
        .replace("localhost:8000", host)
        .replace(DOCS_MODEL, "tiny")
    )


def _requests_file(work: Path) -> None:
    """The batch file the guide's examples upload: lines as the guide shows one."""
    lines = [
        {
            "custom_id": f"doc-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"Summarise {i}"}],
                "max_tokens": 8,
            },
        }
        for i in range(3)
    ]
    (work / "requests.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("page", GUIDE, ids=lambda page: page.name)
def test_the_guides_examples_run_as_written(
    page: Path, stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _requests_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {
        "KEY": ADMIN_KEY,
        "MODEL": "tiny",
        "client": OpenAI(base_url=stack.url + "/v1", api_key=ADMIN_KEY, max_retries=0),
    }
    env = {
        **os.environ,
        **stack.env,
        "KEY": ADMIN_KEY,
        "ADMIN_KEY": ADMIN_KEY,
        "INFERQ": stack.url,
        "INFERQ_API_URL": stack.url,
        "INFERQ_API_KEY": ADMIN_KEY,
        # `inferq` in a block is the one under test.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    # Every client an example makes is closed at the end (they hold connections).
    made: list[OpenAI] = []
    init = OpenAI.__init__

    def recorded(client: OpenAI, *args: Any, **kwargs: Any) -> None:
        init(client, *args, **kwargs)
        made.append(client)

    monkeypatch.setattr(OpenAI, "__init__", recorded)
    try:
        _run(page, stack, namespace, env)
    finally:
        for client in [namespace["client"], *made]:
            client.close()


def _run(page: Path, stack: Stack, namespace: dict[str, Any], env: dict[str, str]) -> None:
    for marker, language, written in _blocks(page):
        if marker.startswith("not run"):
            continue
        code = _as_here(written, stack)
        if language == "python":
            exec(compile(code, f"{page.name} example", "exec"), namespace)  # noqa: S102
            continue
        fails = marker == "fails"
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", code.replace("curl ", "curl --fail-with-body ")],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert (done.returncode != 0) == fails, f"{page.name}:\n{code}\n{done.stdout}{done.stderr}"
