"""Fuzzing the running API with schemathesis against its own OpenAPI schema: no 5xx, and
every response (errors included) matches what the schema documents.

Driven through schemathesis' command line, which is independent of pytest's internals.
`positive_data_acceptance` is left out: limits counted in tokens (prompt plus max_tokens
against the model's context) cannot be written in JSON Schema, so some schema-valid
requests are rightly refused with 422.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ADMIN_KEY, Stack

pytestmark = pytest.mark.engine


def test_the_api_honours_its_schema(stack: Stack, tmp_path: Path) -> None:
    # The fuzzer sets keys' limits through the admin API (its own key's among them, to a
    # request a minute): they are put back after it, for the tests that share this stack.
    limits = {
        key.id: {
            "rpm": key.rpm,
            "tpm": key.tpm,
            "max_queued_tokens": key.quota.max_queued_tokens,
            "daily_tokens": key.quota.daily_tokens,
        }
        for key in stack.keys.list()
    }
    try:
        result = _fuzz(stack, tmp_path)
    finally:
        for key_id, values in limits.items():
            stack.keys.update(key_id, **values)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def _fuzz(stack: Stack, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "run",
            f"{stack.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {ADMIN_KEY}",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--max-examples",
            "40",
            "--seed",
            "20261121",
            "--request-timeout",
            "150",
            # A long poll (`?wait=`) rightly answers after up to `max_wait_s` (120 s).
            "--max-response-time",
            "130",
            "--no-color",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=tmp_path,
    )
