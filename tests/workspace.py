"""A temporary git + DVC repo holding the project's files, for end-to-end tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from flows.run import commit, copy_project
from tests.conftest import ROOT

Run = Callable[..., subprocess.CompletedProcess]


def make_workspace(ws: Path, params: dict, env: dict[str, str], stages: list[str] | None = None) -> Run:
    """Copy the project's code into `ws` (as `rung run` does), write `params`, keep only `stages` of
    dvc.yaml if given, commit, and return a runner of commands in `ws` with `env`
    (plus the venv on PATH, so that DVC's stage commands find its python), that environment as `run.env`."""
    copy_project(ROOT, ws)
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if stages:
        keep_stages(ws, stages)
    env = {**env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def run(*cmd: str, **kw: object) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, check=False, cwd=ws, env=env, capture_output=True, text=True, **kw)

    run.env = env  # type: ignore[attr-defined]  # for commands started with Popen
    commit(ws, "project", env)
    local_identity(ws)
    return run


def local_identity(repo: Path) -> None:
    """A git identity in `repo`'s own config (`git init` it first if need be), so that commits there, `dvc exp run`
    and rung's identity check never depend on the identity of whoever runs the tests (CI has none)."""
    if not (repo / ".git").exists():
        subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for key, value in (("user.name", "rung tests"), ("user.email", "tests@rung.invalid")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)


def keep_stages(ws: Path, stages: list[str]) -> None:
    """Write `ws`'s dvc.yaml as the project's with only `stages` (names of dvc.yaml, a foreach as one)."""
    dag = yaml.safe_load((ROOT / "dvc.yaml").read_text())
    dag["stages"] = {k: v for k, v in dag["stages"].items() if k in stages}
    (ws / "dvc.yaml").write_text(yaml.safe_dump(dag, sort_keys=False))
