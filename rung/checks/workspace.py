"""The workspace a run commits from: DVC experiments (`dvc exp run`, the sweep and the study) commit
each experiment to git, and fail after set-up without a git identity."""

from __future__ import annotations

import logging
import shutil
import subprocess

from rung.config import Params

log = logging.getLogger(__name__)
FIX = 'git config --global user.name "Your Name" && git config --global user.email you@example.com'


def git_identity(params: Params) -> None:
    """Warn (one line, with the fix) when git has no user.name or user.email: `dvc exp run` refuses
    to run then ("Git user name and email must be configured"), while `dvc repro` needs neither."""
    if shutil.which("git") is None:
        return
    missing = [
        key
        for key in ("user.name", "user.email")
        if subprocess.run(["git", "config", key], capture_output=True, text=True).stdout.strip() == ""
    ]
    if missing:
        log.warning(f"git has no {' or '.join(missing)}: `dvc exp run` (sweeps, studies) will fail; set it: {FIX}")
