"""Code of the user's that params name by import path (environment classes, reward functions) is code the stages
run, so DVC must rerun them when it changes, as it does for rung's own modules (dvc.yaml lists those, since DVC
does not follow imports), and `rung run` must carry it into its workspace. The models that learned rewards score
with are read by the `rl` stages alike: listed as their deps too, so that DVC trains a reward model before the RL
that uses it and reruns that RL when it changes (every RL stage: one foreach template). Here: which file each one
is, which dvc.yaml stages run it, the check that the project's dvc.yaml lists it, and the edit that makes a workspace's
dvc.yaml list it. A module installed in the environment (site-packages) is pinned with it, as TRL is: no dep."""

from __future__ import annotations

import importlib.util
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from rung import paths
from rung.checks import dag
from rung.config import Params
from rung.config.envs import BUILTIN_ENVIRONMENTS
from rung.errors import InputError
from rung.objectives import OBJECTIVES
from rung.rl import reward_models_used

ENVIRONMENT_STAGES = ("difficulty", "rl", "eval_base", "eval_sft", "eval_rl")
"""The dvc.yaml stages (a foreach as one) that run the experiment's environment. The traces stage runs only the
built-ins; an RL stage's own environment and its rewards run in `rl` (every RL stage: one foreach template)."""


@dataclass(frozen=True)
class UserCode:
    """One import path of the params, and the stages that run it."""

    key: str
    """The params key that names it, e.g. `environment.name`."""
    path: str
    """`package.module:attr`."""
    stages: tuple[str, ...]

    @property
    def module(self) -> str:
        return self.path.partition(":")[0]


def named(params: Params) -> list[UserCode]:
    """Every import path of `params` that a stage runs: environment classes, reward functions and objectives."""
    out = []
    if params.environment and params.environment.name not in BUILTIN_ENVIRONMENTS:
        out.append(UserCode("environment.name", params.environment.name, ENVIRONMENT_STAGES))
    for name, stage in params.rl.stages.items():
        if stage.environment and stage.environment.name not in BUILTIN_ENVIRONMENTS:
            out.append(UserCode(f"rl.stages.{name}.environment.name", stage.environment.name, ("rl",)))
        out += [
            UserCode(f"rl.stages.{name}.rewards.{reward}.import", spec.import_path, ("rl",))
            for reward, spec in stage.rewards.items()
            if spec.import_path is not None
        ]
        if stage.objective not in OBJECTIVES:
            out.append(UserCode(f"rl.stages.{name}.objective", stage.objective, ("rl",)))
    return out


def _installed(file: Path) -> bool:
    """Whether `file` belongs to the Python environment (the standard library or site-packages)."""
    dirs = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    return any(file.is_relative_to(Path(d).resolve()) for d in dirs)


def source(code: UserCode, root: Path) -> Path | None:
    """The file of `code`'s module relative to the project `root` (where the stages run, first on their
    sys.path as `python -m` puts it); None when it is installed; InputError in one line when it is elsewhere, as
    DVC tracks files of the project only."""
    sys.path.insert(0, str(root))
    try:
        spec = importlib.util.find_spec(code.module)
    except Exception as e:  # noqa: BLE001 - finding a submodule imports its packages: the user's code
        raise InputError(f"{code.key}: cannot load {code.path!r}: {type(e).__name__}: {e}") from None
    finally:
        sys.path.remove(str(root))
    if spec is None or spec.origin is None or not spec.has_location:
        raise InputError(f"{code.key}: {code.module} is not a module file, which DVC could track")
    file = Path(spec.origin).resolve()
    if _installed(file):
        return None
    if not file.is_relative_to(root.resolve()):
        raise InputError(
            f"{code.key}: {code.path} is {file}, outside the project {root.resolve()}; DVC tracks the project's "
            "files only (and `rung run` copies them): move it into the project, or install it as a package"
        )
    return file.relative_to(root.resolve())


def deps(params: Params, root: Path) -> dict[str, list[str]]:
    """dvc.yaml stage -> the files of user code it runs (project-relative, POSIX), in params order."""
    out: dict[str, list[str]] = {}
    for code in named(params):
        if (file := source(code, root)) is None:
            continue
        for stage in code.stages:
            if file.as_posix() not in out.setdefault(stage, []):
                out[stage].append(file.as_posix())
    return out


def model_deps(params: Params) -> dict[str, list[str]]:
    """dvc.yaml stage -> the model directories inside the project that the learned rewards of `params` read."""
    dirs = list(dict.fromkeys(model.as_posix() for _, model in _project_models(params)))
    return {"rl": dirs} if dirs else {}


def _models_read(params: Params) -> list[tuple[str, Path]]:
    """(params key, model directory) of each model a learned reward of an RL stage scores with."""
    out = []
    for name, stage in params.rl.stages.items():
        for reward, spec in stage.rewards.items():
            key, model = f"rl.stages.{name}.rewards.{reward}.args.model", spec.args.get("model")
            if spec.import_path is None and reward in reward_models_used.STAGES and isinstance(model, str):
                out.append((key, reward_models_used.model_dir(model, reward)))
            elif spec.import_path is None and reward == "judge":
                out.append((key, reward_models_used.judge_dir(model or "sft")))
    return out


def _project_models(params: Params) -> list[tuple[str, Path]]:
    """The learned rewards' models inside the project (relative paths: a stage's output or the user's files); one
    elsewhere is the user's to keep fixed, as DVC tracks the project's files only."""
    return [(key, model) for key, model in _models_read(params) if not model.is_absolute()]


def listed(params_file: Path, params: Params) -> None:
    """`params_file` when DVC reads it (params.yaml beside a dvc.yaml): each file of user code must be a dep of
    every stage that runs it, else editing it reruns nothing. Refused in one line naming the key and the fix."""
    root = params_file.parent
    dag_file = root / "dvc.yaml"
    if params_file.name != paths.PARAMS.name or not dag_file.is_file():
        return  # a recipe: `rung run` lists them in its workspace's dvc.yaml
    stages = dag.stages(dag_file)
    for code in named(params):
        file = source(code, root)
        missing = [s for s in code.stages if s in stages and file and file.as_posix() not in dag.stage_deps(stages[s])]
        if missing:
            raise InputError(
                f"{code.key}: {file} is code that dvc.yaml's stages {', '.join(missing)} run, and not in their deps "
                f"(DVC would not rerun them when it changes); add it to their deps, or run with `rung run`"
            )
    rl = dag.stage_deps(stages["rl"]) if "rl" in stages else []
    for key, model in _project_models(params):
        if "rl" in stages and model.as_posix() not in rl:
            raise InputError(
                f"{key}: {model} is a model that dvc.yaml's rl stages read, and not in their deps (DVC would not "
                "train it first, nor rerun them when it changes); add it to their deps, or run with `rung run`"
            )


def add(dag_file: Path, files: dict[str, list[str]]) -> None:
    """Add `files` (stage -> files) to the deps of the stages of `dag_file` (a `rung run` workspace's), keeping
    its comments and order."""
    from ruamel.yaml import YAML  # DVC's own YAML library: a round trip keeps dvc.yaml as written

    if not files:
        return
    rt = YAML()
    rt.indent(mapping=2, sequence=4, offset=2)  # dvc.yaml's own layout
    rt.width = 4096
    dag = rt.load(dag_file.read_text())
    for name, added in files.items():
        stage = dag["stages"].get(name)
        if stage is None:
            continue
        stage = stage.get("do", stage)
        stage.setdefault("deps", [])
        stage["deps"] += [f for f in added if f not in stage["deps"]]
    with dag_file.open("w") as f:
        rt.dump(dag, f)
