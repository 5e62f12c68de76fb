"""The README's set-up scripts say in one line what is missing before installing anything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _venv(
    tmp_path: Path, python: str, *, path: str | None = None
) -> subprocess.CompletedProcess[str]:
    # A copy of the scripts, so no .venv of the checkout is seen or touched.
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    return subprocess.run(
        ["bash", str(tmp_path / "scripts" / "venv"), "cpu"],
        env={**os.environ, "PYTHON": python, "PATH": path or os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_no_python_says_which_variable_points_at_one(tmp_path: Path) -> None:
    done = _venv(tmp_path, "python-that-is-not-here")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "scripts/venv: no python-that-is-not-here here: install Python 3.11 or newer, or "
        "point PYTHON at one"
    )
    assert not (tmp_path / ".venv").exists()


def test_an_old_python_is_named_with_its_version(tmp_path: Path) -> None:
    old = tmp_path / "python3.9"
    old.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 1\necho "Python 3.9.2"\n')
    old.chmod(0o755)
    done = _venv(tmp_path, str(old))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"scripts/venv: inferq needs Python 3.11 or newer, and {old} is Python 3.9.2: "
        "set PYTHON=python3.11 (or newer)"
    )
    assert not (tmp_path / ".venv").exists()


def _uname(tmp_path: Path, system: str, machine: str) -> str:
    """A PATH whose `uname` says `system` and `machine`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uname = bin_dir / "uname"
    uname.write_text(f'#!/bin/sh\n[ "$1" = -s ] && echo {system} || echo {machine}\n')
    uname.chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_a_mac_is_told_to_use_compose_before_anything_is_installed(tmp_path: Path) -> None:
    done = _venv(tmp_path, "python3", path=_uname(tmp_path, "Darwin", "arm64"))
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "inferq runs on Linux (x86-64 or ARM64), and this is Darwin arm64.",
        "Here, run it with Docker instead: docker compose up -d (docs/deployment.md).",
    ]
    assert not (tmp_path / ".venv").exists()


def test_linux_on_arm64_passes_the_platform_check(tmp_path: Path) -> None:
    done = _venv(tmp_path, "python-that-is-not-here", path=_uname(tmp_path, "Linux", "aarch64"))
    # Past the platform check, on to the next one.
    assert done.stderr.strip().startswith("scripts/venv: no python-that-is-not-here here")
