"""`inferq batch download --partial` against the running stack: results gathered while
the batch runs, each line once."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import Stack
from tests.integration.api.test_batch_output import (
    QUICK,
    SLOW,
    quick_lines_ended,
    running_batch,
)
from tests.integration.api.test_batches import client_for, wait_for
from tests.integration.cli.test_batch_cli import inferq

pytestmark = pytest.mark.engine


def added(stderr: str) -> tuple[int, int]:
    """The results and errors a `--partial` run says it added."""
    said = re.search(r"added (\d+) results to .* and (\d+) errors to ", stderr)
    assert said is not None, stderr
    return int(said[1]), int(said[2])


def test_partial_downloads_append_each_line_once(stack: Stack, tmp_path: Path) -> None:
    client = client_for(stack)
    batch_id = running_batch(stack)
    out = tmp_path / "out.jsonl"
    download = ("download", batch_id, "-o", str(out), "--partial")
    with stack.client() as http:
        quick_lines_ended(http, batch_id)

    # The worker (and its engine) frozen until the batch is cancelled: however quick the
    # machine, the slow lines are still running when it is.
    with stack.worker.frozen():
        first = inferq(stack, *download)
        assert first.returncode == 0, first.stderr
        assert "is still running" in first.stderr
        results, errors = added(first.stderr)
        assert results >= QUICK
        assert errors == 0
        assert len(out.read_text().splitlines()) == results
        assert (tmp_path / "out.jsonl.cursor").read_text().strip() == str(results)

        second = inferq(stack, *download)
        assert second.returncode == 0, second.stderr

        client.batches.cancel(batch_id)
    batch = wait_for(client, batch_id)
    last = inferq(stack, *download)
    assert last.returncode == 0, last.stderr
    assert "has ended" in last.stderr
    assert added(last.stderr)[1] > 0
    assert (tmp_path / "out.jsonl.cursor").read_text().strip() == str(QUICK + SLOW)

    assert batch.output_file_id is not None
    assert batch.error_file_id is not None
    assert out.read_bytes() == client.files.content(batch.output_file_id).content
    assert (
        out.with_suffix(".errors.jsonl").read_bytes()
        == client.files.content(batch.error_file_id).content
    )
    again = inferq(stack, *download)
    assert again.returncode == 0, again.stderr
    assert added(again.stderr) == (0, 0)
    assert "has ended" in again.stderr


def test_partial_download_of_an_unknown_batch_fails(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    result = inferq(stack, "download", "batch_nothing", "-o", str(out), "--partial")
    assert result.returncode == 2
    assert "inferq: error 404: no batch with id 'batch_nothing'" in result.stderr
    assert not out.exists()
    assert not (tmp_path / "out.jsonl.cursor").exists()
