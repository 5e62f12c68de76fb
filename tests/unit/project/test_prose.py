"""The code's prose states contracts: no module docstring retells a story over
`MAX_MODULE_DOCSTRING_LINES`, and no docstring, comment or setting description carries a
measured figure (measurements go stale; they live in bench/RESULTS.md)."""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

from inferq.settings import Settings

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("api", "cli", "housekeeper", "inferq", "worker")
MAX_MODULE_DOCSTRING_LINES = 12
# A number with a unit of time, rate, share, size or speed-up: "45 µs", "0.2-2.5 s", "3.7%",
# "2-4x", "11,634 tokens/s".
FIGURE = re.compile(
    r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?:\s?[-\u2013]\s?\d[\d,]*(?:\.\d+)?)?\s?"
    r"(?:ms|µs|us|ns|s|seconds?|minutes?|hours?|%|x|\u00d7|[a-z]+/s|GiB|MiB|GB|MB)"
    r"(?![\w%\u00d7])"
)
# A measurement in words ("a tenth of their CPU", "five times as fast"), and history: what
# happened once, not what the code promises.
HISTORY = re.compile(
    r"\b(?:a (?:tenth|fifth|quarter|third|half) of (?:its|their|the) CPU"
    r"|(?:two|three|four|five|ten|several) times (?:as|faster|quicker|slower|the)"
    r"|issue #?\d+|seen with|before the fix|in this session)\b",
    re.I,
)
# Figures that are contracts, not measurements, each with the reason it stays.
CONTRACT_FIGURES = {
    # The file store's chunk size: what one row holds.
    ("inferq/store/files.py", "1 MiB"),
    # The worker's health check: how long a probe waits for the ping's answer.
    ("cli/main.py", "5 s"),
    # The result writer's bound on a batch line's wait (`BULK_WAIT_S`).
    ("INFERQ_RESULT_FLUSH_MS", "1 s"),
    # How far each webhook delivery's delay may move.
    ("INFERQ_WEBHOOK_RETRY_SCHEDULE_S", "10%"),
}
# `Quoted code` is an example of what to type (`4GiB`), not a claim.
CODE = re.compile(r"`[^`\n]*`")


@functools.cache
def _product_files() -> tuple[tuple[str, str, ast.Module], ...]:
    """(path, source, tree) of every product module, parsed once for every test."""
    paths = sorted(path for package in PRODUCT for path in (ROOT / package).rglob("*.py"))
    sources = [(str(path.relative_to(ROOT)), path.read_text()) for path in paths]
    return tuple((where, source, ast.parse(source)) for where, source in sources)


def _docstrings(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield text


def _comments(source: str) -> Iterator[str]:
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.string


def _prose() -> Iterator[tuple[str, str]]:
    """(where, text) for every docstring, comment and setting description."""
    for where, source, tree in _product_files():
        for text in (*_docstrings(tree), *_comments(source)):
            yield where, text
    for name, field in Settings.model_fields.items():
        yield f"INFERQ_{name.upper()}", field.description or ""


def test_no_module_docstring_in_product_code_is_longer_than_a_contract() -> None:
    long = {}
    for where, _, tree in _product_files():
        lines = len((ast.get_docstring(tree, clean=False) or "").strip().splitlines())
        if lines > MAX_MODULE_DOCSTRING_LINES:
            long[where] = lines
    assert long == {}, "state the module's contract; its story goes in docs/how-it-works.md"


def test_no_docstring_comment_or_setting_description_carries_a_measured_figure() -> None:
    found = [
        (where, " ".join(match.group().split()))
        for where, text in _prose()
        for prose in [CODE.sub("", text)]
        for match in (*FIGURE.finditer(prose), *HISTORY.finditer(prose))
    ]
    assert [f for f in found if f not in CONTRACT_FIGURES] == [], (
        "measurements and history go to bench/RESULTS.md; name the constant a contract uses"
    )


def test_the_figure_finder_tells_a_measurement_from_a_name() -> None:
    measured = ("27-43 stalls of 0.2-2.5 s", "45 µs", "3.7%", "2-4x sooner", "11,634 tokens/s")
    assert all(FIGURE.search(text) for text in measured)
    named = ("every `HEARTBEAT_S`", "max_tokens", "vLLM 0.32 API", "p99 latency", "0x7f", "1s_")
    assert not any(FIGURE.search(text) for text in named)
    assert HISTORY.search("seen with vllm 0.32")
    assert HISTORY.search("noise that cost the worker a tenth of their CPU")
    assert not HISTORY.search("renewed every third of a lease")
