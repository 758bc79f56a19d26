"""The advantage part of rung's RL trainers: the stage's objective (rung.objectives) resolved, by its registered
name or its import path, and applied to each generated batch's rewards."""

from __future__ import annotations

import inspect
import pkgutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rung.config import RLStageParams
from rung.errors import InputError
from rung.objectives import OBJECTIVES, Objective, of_function

if TYPE_CHECKING:  # the preflight (rung validate) resolves objectives without loading torch
    import torch


def resolve(stage: RLStageParams, key: str) -> Objective:
    """The stage's objective; one given by its import path loaded and checked against the stage as a registered
    one is (InputError naming `key`.objective where it cannot be loaded, has not the objectives' signature, or
    refuses a setting of the stage)."""
    if stage.objective in OBJECTIVES:
        return OBJECTIVES[stage.objective]
    where = f"{key}.objective"
    try:
        func = pkgutil.resolve_name(stage.objective)
    except (ImportError, AttributeError, ValueError) as e:
        raise InputError(f"{where}: cannot load {stage.objective!r}: {e}") from None
    try:
        inspect.signature(func).bind(*range(5))
    except (TypeError, ValueError):
        raise InputError(
            f"{where}: {stage.objective!r} must be a function (rewards, reward_names, trl_advantages, group_size, "
            "settings) -> advantages (rung.objectives.registry)"
        ) from None
    objective = of_function(func) or Objective(stage.objective, func)
    try:
        objective.check(
            stage.algorithm,
            stage.loss_type,
            stage.beta,
            stage.dynamic_sampling is not None,
            {name: reward.weight for name, reward in stage.rewards.items()},
        )
    except ValueError as e:
        raise InputError(f"{key}.{e}") from None
    return objective


@dataclass(frozen=True)
class Advantages:
    """A stage's objective with its settings: the advantages of a generated batch from its rewards."""

    objective: Objective
    settings: Mapping[str, Any]
    """The stage's params, as the objective reads them (rung.objectives.registry)."""

    @classmethod
    def of(cls, stage: RLStageParams, key: str) -> Advantages:
        return cls(resolve(stage, key), stage.model_dump())

    def __call__(
        self, rewards: torch.Tensor, reward_names: Sequence[str], trl_advantages: torch.Tensor, group_size: int
    ) -> torch.Tensor:
        """(rows,) advantages of every process's rows from their (rows, reward functions) rewards and TRL's own."""
        out = self.objective.advantages(rewards, reward_names, trl_advantages, group_size, self.settings)
        if out.shape != trl_advantages.shape:
            raise ValueError(
                f"objective {self.objective.name} returned advantages of shape {tuple(out.shape)} for "
                f"{tuple(trl_advantages.shape)} rows"
            )
        return out
