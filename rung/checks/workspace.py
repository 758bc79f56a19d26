"""The workspace a run commits from: DVC experiments (`dvc exp run`, the sweep and the study) commit
each experiment to git, and fail after set-up without a git identity; `dvc repro` needs none. And the
params file DVC reads, which must spell out every key its stages read."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from rung import paths
from rung.config import Params, read_yaml
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


def dvc_params(params_file: Path) -> None:
    """`params_file` when DVC reads it (params.yaml beside a dvc.yaml) must hold every key the stages list
    as params or interpolate (${...}): DVC stops at the first stage whose key is missing, after running
    the stages before it, though rung would fill in a default. Refused in one line naming the keys."""
    dag_file = params_file.parent / "dvc.yaml"
    if params_file.name != paths.PARAMS.name or not dag_file.is_file():
        return  # a recipe: `rung run` writes every default out in its workspace
    data = read_yaml(params_file)
    missing = [key for key in _dvc_keys(read_yaml(dag_file), data) if not _has(data, key)]
    if missing:
        listed = ", ".join(missing[:6]) + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else "")
        raise InputError(
            f"{params_file}: dvc.yaml's stages read {listed}, left to rung's defaults here, and DVC stops at a "
            f"stage whose params are missing: run it as `rung run {params_file}` (every default written out), "
            "or write these keys out"
        )


def _dvc_keys(dag: dict[str, Any], data: Any) -> list[str]:
    """The params keys of dvc.yaml's stages, in order without repeats: their `params` entries (of the
    default params file) and every ${...} they interpolate, a foreach stage expanded over the names that
    `data` gives it (${key} the name, ${item.x} its `x`)."""
    keys: list[str] = []
    for stage in dag.get("stages", {}).values():
        bodies = [stage]
        if "foreach" in stage:
            over = str(stage["foreach"]).removeprefix("${").removesuffix("}")
            keys.append(over)
            names = _get(data, over)
            text = yaml.safe_dump(stage["do"])
            bodies = [
                yaml.safe_load(text.replace("${key}", str(name)).replace("${item", f"${{{over}.{name}"))
                for name in (names if isinstance(names, dict) else {})
            ]
        for body in bodies:
            keys += [p for p in body.get("params", []) if isinstance(p, str)]
            keys += re.findall(r"\$\{([\w.-]+)\}", yaml.safe_dump(body))
    return list(dict.fromkeys(keys))


def _get(data: Any, key: str) -> Any:
    for part in key.split("."):
        data = data.get(part) if isinstance(data, dict) else None
    return data


def _has(data: Any, key: str) -> bool:
    *parents, leaf = key.split(".")
    node = _get(data, ".".join(parents)) if parents else data
    return isinstance(node, dict) and leaf in node
