"""The workspace a run commits from: DVC experiments (`dvc exp run`, the sweep and the study) commit
each experiment to git, and fail after set-up without a git identity; `dvc repro` needs none."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from rung.config import Params
from rung.errors import InputError

log = logging.getLogger(__name__)
FIX = 'git config --global user.name "Your Name" && git config --global user.email you@example.com'


def _missing_identity() -> str:
    """'user.name or user.email' (what git lacks of an identity), or '' when it has both."""
    if shutil.which("git") is None:
        return ""
    missing = [
        key
        for key, variable in (("user.name", "GIT_AUTHOR_NAME"), ("user.email", "GIT_AUTHOR_EMAIL"))
        if not os.environ.get(variable)
        and subprocess.run(["git", "config", key], capture_output=True, text=True).stdout.strip() == ""
    ]
    return " or ".join(missing)


def warn_git_identity(params: Params) -> None:
    """`rung validate` and `make demo`: one warning line with the fix, before `dvc exp run` fails
    with "Git user name and email must be configured"."""
    if missing := _missing_identity():
        log.warning(f"git has no {missing}: `dvc exp run` (sweeps, studies) will fail; set it: {FIX}")


def git_identity(params: Params) -> None:
    """The sweep and the study (DVC experiments): refuse in one line before anything is queued."""
    if missing := _missing_identity():
        raise InputError(f"git has no {missing}, and DVC experiments are git commits; set it: {FIX}")
