"""What eval.samples.rerank needs before any compute: rerankers that are what their key says (a reward model: a
sequence-classification checkpoint; a PRM: a process reward model's directory), named by a stage of their
section or by a directory inside the project, on single-turn samples; and, since DVC does not know that an eval
stage reads a reranker's directory, that directory as a dep of every eval stage (`rung run` adds it to its
workspace's dvc.yaml, as it does for user code: rung.checks.usercode)."""

from __future__ import annotations

from pathlib import Path

from rung import paths
from rung.checks import dag
from rung.config import Params
from rung.errors import InputError
from rung.eval.rerank import SECTIONS, directories

EVAL_STAGES = ("eval_base", "eval_sft", "eval_rl")
"""The dvc.yaml stages (a foreach as one) that rerank their samples."""

KEY = "eval.samples.rerank"


def rerank(params: Params) -> None:
    """Each reranker names a stage of its own kind or a checkpoint of that kind, and the samples are single-turn."""
    rerank = params.eval.samples.rerank if params.eval.samples else None
    if rerank is None:
        return
    if params.environment is not None:
        raise InputError(f"{KEY}: reranks single-turn samples, and the experiment runs episodes (environment)")
    for kind, path in directories(params).items():
        key, section, value = f"{KEY}.{kind}", SECTIONS[kind], getattr(rerank, kind)
        if value in getattr(params, section):
            continue  # its stage writes a checkpoint of this kind
        if not path.is_dir():
            raise InputError(
                f"{key}: {value!r} is no {section} stage (have {sorted(getattr(params, section))}) and no directory"
            )
        if kind == "reward_model":
            from rung.rewardmodels import scoring  # loads transformers: only when a reward model reranks

            scoring.members(path, key)
        else:
            from rung.rewardmodels.scoring import SETTINGS

            if not (path / SETTINGS).is_file():
                raise InputError(f"{key}: {path} is not a process reward model (no {SETTINGS})")


def deps(params: Params, root: Path) -> dict[str, list[str]]:
    """dvc.yaml stage -> the rerankers' directories (project-relative, POSIX); InputError naming the key for a
    directory outside the project, which DVC cannot track."""
    out: list[str] = []
    for kind, path in directories(params).items():
        full = (root / path).resolve()
        if not full.is_relative_to(root.resolve()):
            raise InputError(
                f"{KEY}.{kind}: {path} is outside the project {root.resolve()}; DVC tracks the project's files only: "
                "move it into the project, or name a stage"
            )
        out.append(full.relative_to(root.resolve()).as_posix())
    return {stage: out for stage in EVAL_STAGES} if out else {}


def given(params: Params) -> list[Path]:
    """The rerankers' directories that no stage of the experiment writes (a `rung run` workspace copies them)."""
    rerank = params.eval.samples.rerank if params.eval.samples else None
    return [
        path
        for kind, path in directories(params).items()
        if rerank is not None and getattr(rerank, kind) not in getattr(params, SECTIONS[kind])
    ]


def listed(params_file: Path, params: Params) -> None:
    """`params_file` when DVC reads it (params.yaml beside a dvc.yaml): each reranker's directory must be a dep of
    every eval stage, else DVC neither orders the eval after the reranker's stage nor reruns it when the reranker
    changes. Refused in one line naming the key and the fix."""
    root = params_file.parent
    dag_file = root / "dvc.yaml"
    if params_file.name != paths.PARAMS.name or not dag_file.is_file():
        return  # a recipe: `rung run` lists them in its workspace's dvc.yaml
    stages = dag.stages(dag_file)
    for stage, dirs in deps(params, root).items():
        missing = [d for d in dirs if stage in stages and d not in dag.stage_deps(stages[stage])]
        if missing:
            raise InputError(
                f"{KEY}: {', '.join(missing)} is what dvc.yaml's {stage} reranks with, and not in its deps (DVC would "
                f"not run its stage first, nor rerun the eval when it changes); add it to the deps of "
                f"{', '.join(EVAL_STAGES)}, or run with `rung run`"
            )
