"""A temporary git + DVC repo holding the project's files, for end-to-end tests."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml

from tests.conftest import ROOT

Run = Callable[..., subprocess.CompletedProcess]


def make_workspace(ws: Path, params: dict, env: dict[str, str], stages: list[str] | None = None) -> Run:
    """Copy the project's tracked files (no data, tests or dvc.lock) into `ws`, write `params`, keep
    only `stages` of dvc.yaml if given, commit, and return a runner of commands in `ws` with `env`
    (plus the venv on PATH, so that DVC's stage commands find its python), that environment as `run.env`."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for f in files:
        if f.startswith(("data/", "tests/")) or f == "dvc.lock" or not (ROOT / f).is_file():
            continue
        (ws / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, ws / f)
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    if stages:
        dag = yaml.safe_load((ROOT / "dvc.yaml").read_text())
        dag["stages"] = {k: v for k, v in dag["stages"].items() if k in stages}
        (ws / "dvc.yaml").write_text(yaml.safe_dump(dag, sort_keys=False))
    env = {**env, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def run(*cmd: str, **kw: object) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, check=False, cwd=ws, env=env, capture_output=True, text=True, **kw)

    run.env = env  # type: ignore[attr-defined]  # for commands started with Popen
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    dvc_init = [] if (ws / ".dvc").exists() else [["dvc", "init", "-q"]]  # .dvc/config is tracked by git
    for cmd in (["git", "init", "-q"], *dvc_init, ["git", "add", "-A"], [*git, "commit", "-q", "-m", "project"]):
        res = run(*cmd)
        assert res.returncode == 0, (cmd, res.stderr)
    return run
