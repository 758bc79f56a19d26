"""Which model a learned reward of an RL stage reads, and its settings checked before any compute: light (no torch
or transformers at import), since every stage's preflight and the dvc.yaml checks read it. The rewards themselves
are rung.rl.learned_rewards and rung.rl.judge."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rung import paths
from rung.errors import InputError

STAGES = {"reward_model": "reward_models", "process": "process_reward_models"}
"""The params section whose stages each learned reward kind can name as its `model`."""
AGGREGATES = {"reward_model": ("mean", "min", "mean_minus_std"), "process": ("min", "last", "mean")}
"""Each kind's `aggregate`s, the first its default: over an ensemble's members, over a solution's steps."""


def known_aggregate(kind: str, how: str, key: str) -> str:
    if how not in AGGREGATES[kind]:
        raise InputError(f"{key}: {how!r} is not one of {list(AGGREGATES[kind])}")
    return how


def model_dir(model: str, kind: str) -> Path:
    """`<section>/<name>` names that stage's output (data/models/<section>/<name>); anything else is a path."""
    section, _, name = model.partition("/")
    return paths.learned_reward(section, name) if section == STAGES[kind] and name else Path(model)


def judge_dir(model: str) -> Path:
    """The judge's model: a checkpoint name (base, sft) or a directory."""
    return paths.checkpoint(model) if model in ("base", "sft") else Path(model)


def check(kind: str, args: dict[str, Any], sections: dict[str, Any], key: str) -> None:
    """Before any compute: the `model` of a learned reward is a stage of its section in params, or a directory
    holding such a model (a reward model: sequence-classification checkpoints; a PRM: its settings file)."""
    known_aggregate(kind, args.get("aggregate", AGGREGATES[kind][0]), f"{key}.args.aggregate")
    model = args.get("model")
    if not isinstance(model, str):
        raise InputError(f"{key}.args.model: missing; a {STAGES[kind]} stage (`{STAGES[kind]}/<name>`) or a path")
    section, _, name = model.partition("/")
    if section == STAGES[kind] and name:
        if name not in sections[section]:
            raise InputError(f"{key}.args.model: {section} has no stage {name!r} (have {list(sections[section])})")
        return
    if kind == "reward_model":
        from rung.rewardmodels import scoring  # transformers: only for a reward model given by path

        scoring.members(model, f"{key}.args.model")
    elif not (Path(model) / paths.PRM_SETTINGS).is_file():
        raise InputError(f"{key}.args.model: {model} is not a process reward model (no {paths.PRM_SETTINGS})")
