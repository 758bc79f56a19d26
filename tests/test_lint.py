"""The code passes `ruff check`, `ruff format --check` and mypy (the configuration is in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys

from tests.imports import ROOT

PATHS = ["rung", "flows", "tasks", "tests", "bench"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "--no-cache", *PATHS], cwd=ROOT, capture_output=True, text=True
    )


def test_ruff_check_passes():
    res = _ruff("check")
    assert res.returncode == 0, f"ruff check failed:\n{res.stdout}{res.stderr}"


def test_ruff_format_check_passes():
    res = _ruff("format", "--check")
    assert res.returncode == 0, f"ruff format --check failed (run `ruff format`):\n{res.stdout}{res.stderr}"


def test_mypy_passes():
    # pyproject.toml's [tool.mypy] names the files (rung/, flows/, tasks/); the incremental cache in .mypy_cache/
    # makes a rerun re-check only what changed
    res = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, f"mypy failed:\n{res.stdout}{res.stderr}"
