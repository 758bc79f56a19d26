"""`rung run RECIPE`: one experiment from a params file (a recipe of recipes/, or any), with dotted
overrides, in a workspace of its own, so that the project's params.yaml and outputs stay as they are.

The workspace (default runs/<recipe>) is a git + DVC repo holding a copy of the project's code and
the merged params.yaml; `dvc repro` runs there under one Prefect server, MLflow records into the
project's store (runs of recipes and of the default compare in one UI), and the results table is
printed. Running it again reruns only what the changed code or overrides made stale; the
workspace is a plain DVC project, so `cd runs/<recipe> && dvc exp run -S key=value` works too.

    rung run recipes/dapo.yaml --set model.source=Qwen/Qwen2.5-Math-1.5B --set rl.stages.main.max_steps=50
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from flows import with_server
from rung import config, files, paths, preflight
from rung.checks import rerank, usercode
from rung.config import FileSource, HFSource, Params
from rung.errors import InputError

RUNS = Path("runs")
"""Default parent of run workspaces (git-ignored)."""
SKIPPED = ("data/", "tests/", "runs/", "dvc.lock")
"""Project paths not copied into a workspace: outputs, tests, other runs, the project's own lock."""


def overrides(pairs: list[str]) -> dict[str, Any]:
    """`key=value` pairs (the value read as YAML, as `dvc exp run -S` does) -> {dotted key: value}."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"--set {pair!r}: expected KEY=VALUE, e.g. rl.stages.main.max_steps=50")
        out[key.strip()] = yaml.safe_load(value)
    return out


def resolve(recipe: Path, sets: dict[str, Any]) -> Params:
    """The recipe with `sets` applied and local paths made absolute (the run happens elsewhere),
    validated against the schema and preflighted; InputError naming the key or file otherwise."""
    data = config.with_overrides(config.read_yaml(recipe), sets)
    where = f"{recipe}" + (f" with --set {', '.join(sets)}" if sets else "")
    _absolute_paths(data, config.parse(data, where))
    params = config.parse(data, where)
    preflight.check(params)
    return params


def written(params: Params) -> str:
    """The run's params.yaml: every setting spelled out, defaults included, so that DVC finds each
    key its stages depend on and the run does not change when a default of rung does."""
    return yaml.safe_dump(params.model_dump(mode="json", by_alias=True), sort_keys=False)


def _absolute_paths(data: dict[str, Any], params: Params) -> None:
    """Rewrite, in place, every local path of `data` (files, dataset and model directories) as absolute."""

    def local(path: str) -> bool:  # relative to where `rung run` was started
        return files.is_local_path(path) and not Path(path).is_absolute()

    for section, sources in (("curate", params.curate.sources), ("eval", params.eval.sets)):
        raw = data[section]["sources" if section == "curate" else "sets"]
        for i, src in enumerate(sources):
            if isinstance(src, FileSource) and not Path(src.path).is_absolute():
                raw[i]["path"] = str(Path(src.path).expanduser().resolve())
            elif isinstance(src, HFSource) and local(src.dataset):
                raw[i]["dataset"] = str(Path(src.dataset).expanduser().resolve())
    if local(params.model.source) and params.model.source != "embedded":
        data["model"]["source"] = str(Path(params.model.source).expanduser().resolve())
    for i, trace in enumerate(params.sft.traces):
        model = getattr(trace, "model", "base")
        if model != "base" and local(model):
            data["sft"]["traces"][i]["model"] = str(Path(model).expanduser().resolve())


def copy_project(root: Path, ws: Path) -> None:
    """Copy the project's code (tracked and untracked-but-not-ignored files, none of SKIPPED) into `ws`."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for f in listed:
        if f.startswith(SKIPPED) or not (root / f).is_file():
            continue
        (ws / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, ws / f)


def venv_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with this interpreter's bin first on PATH (DVC's stage commands `python -m
    flows.<stage>` and `dvc` itself must be the venv's even when it is not activated), plus `extra`."""
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **(extra or {}),
    }


def commit(ws: Path, message: str, env: dict[str, str] | None = None) -> None:
    """Make `ws` a git + DVC repo if it is not one yet, and commit everything in it (if anything changed)."""
    env = env or venv_env()
    git = ["git", "-c", "user.name=rung", "-c", "user.email=rung@localhost"]
    steps = [["git", "init", "-q"]] if not (ws / ".git").exists() else []
    steps += [["dvc", "init", "-q"]] if not (ws / ".dvc" / "config").exists() else []
    for cmd in [*steps, ["git", "add", "-A"]]:
        subprocess.run(cmd, cwd=ws, env=env, check=True, capture_output=True)
    if subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=ws, env=env, check=False).returncode:
        subprocess.run([*git, "commit", "-q", "-m", message], cwd=ws, env=env, check=True, capture_output=True)


def prepare(recipe: Path, sets: dict[str, Any], ws: Path, root: Path | None = None) -> Path:
    """Validate the run, then write its workspace (default root: the current directory): the
    project's code, user code the params name by import path (a dep of the stages that run it in the
    workspace's dvc.yaml), the models learned rewards read as deps of the rl stages, and the merged params.yaml."""
    root = (root or Path.cwd()).resolve()
    params = resolve(recipe, sets)
    code = usercode.deps(params, root)
    reranker_dirs = rerank.deps(params, root)  # refuses a reranker outside the project before any write
    _importable_from_the_workspace(params, root)
    ws.mkdir(parents=True, exist_ok=True)
    copy_project(root, ws)
    for file in {f for stage_files in code.values() for f in stage_files}:  # also when git ignores it
        (ws / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / file, ws / file)
    usercode.add(ws / "dvc.yaml", code)
    usercode.add(ws / "dvc.yaml", usercode.model_deps(params))  # trained by stages of the workspace: not copied
    for given in rerank.given(params):  # a reranker no stage writes: the project's copy, a dep as its code is
        shutil.copytree(root / given, ws / given, dirs_exist_ok=True)
    usercode.add(ws / "dvc.yaml", reranker_dirs)
    (ws / paths.PARAMS).write_text(
        f"# rung run {recipe}"
        + "".join(f" --set {k}={json.dumps(v)}" for k, v in sets.items())
        + "\n"
        + written(params)
    )
    commit(ws, f"rung run {recipe}")
    return ws


def _importable_from_the_workspace(params: Params, root: Path) -> None:
    """The stages import user code from their working directory (first on sys.path): the workspace's copy of a
    module must be the file they find there, not one that another sys.path entry leads back to in the project."""
    for code in usercode.named(params):
        file = usercode.source(code, root)
        parts = code.module.split(".")
        if file is not None and file not in (Path(*parts).with_suffix(".py"), Path(*parts, "__init__.py")):
            raise InputError(
                f"{code.key}: {code.module} is imported from {file}, not from the project root, so the workspace's "
                f"copy would not be the code that runs; make it importable from the project root"
            )


def run(recipe: Path, sets: dict[str, Any], ws: Path, dry_run: bool = False, root: Path | None = None) -> int:
    """Prepare the workspace, then (unless `dry_run`) `dvc repro` there under one Prefect server with
    MLflow recording into the project's store; returns the exit code."""
    root = (root or Path.cwd()).resolve()
    prepare(recipe, sets, ws, root)
    if dry_run:
        return 0
    uri = (
        os.environ.get("MLFLOW_TRACKING_URI")
        or config.load(ws / paths.PARAMS).tracking.uri
        or f"sqlite:///{root / 'mlflow.db'}"
    )
    return with_server.run(["dvc", "repro"], cwd=ws, env=venv_env({"MLFLOW_TRACKING_URI": uri}))


def default_dir(recipe: Path) -> Path:
    """runs/<recipe file name without suffix>."""
    return RUNS / recipe.stem
