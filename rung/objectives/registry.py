"""The advantage functions an RL stage trains with (`rl.stages.<name>.objective`), registered by name as
verl registers its estimators (`@register_adv_est`): each a plain function of tensors, and the settings it
needs, which rung.config checks at `rung validate` (this part imports no torch, so the config can read it).

An objective is `(rewards, reward_names, trl_advantages, group_size, settings) -> advantages`: `rewards` the
(rows, reward functions) TRL scored, NaN where one declined, a row unscored by every one all NaN; `reward_names`
their names in that order; `trl_advantages` (rows,) the advantage TRL computed from them (group-relative, or
RLOO's leave-one-out); `group_size` the completions per prompt (rows are whole groups in a row); `settings` the
stage's params (`RLStageParams.model_dump()`). Rows are those of every process. It returns (rows,) advantages,
which TRL's loss trains with in place of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

AdvantageFn = Callable[["Tensor", Sequence[str], "Tensor", int, Mapping[str, Any]], "Tensor"]


@dataclass(frozen=True)
class Objective:
    """An advantage function and what the stage training with it must satisfy."""

    name: str
    advantages: AdvantageFn
    trains_on: str = ""
    """What it trains on, for the errors below ("trains on the accuracy reward's sign alone")."""
    reward: str | None = None
    """The one reward it reads: the stage must have it, and every other reward at weight 0."""
    algorithms: tuple[str, ...] = ("grpo", "rloo")
    """The TRL trainers (`algorithm`) whose loss takes its advantages as they mean them."""
    loss_types: tuple[str, ...] | None = None
    """TRL's loss aggregations its gradient holds under (None: every one)."""
    loss_why: str = ""
    """Why only those, for the error."""
    kl: bool = True
    """Whether a KL penalty (beta > 0) leaves its gradient as meant."""
    dynamic_sampling: bool = True
    """Whether DAPO's dynamic sampling (dropping groups of equal rewards) leaves its gradient as meant."""
    preset: Mapping[str, Any] | None = None
    """The stage settings of its published recipe: `preset: <name>` selects them (rung.config.PRESETS)."""

    def check(
        self, algorithm: str, loss_type: str, beta: float, dynamic_sampling: bool, weights: Mapping[str, float]
    ) -> None:
        """ValueError, naming the stage's key that breaks this objective, with the fix."""
        why = f"objective {self.name} {self.trains_on}".rstrip()
        if algorithm not in self.algorithms:
            raise ValueError(
                f"algorithm: {why}, through {_trainers(self.algorithms)}; use algorithm {self.algorithms[0]}"
            )
        if dynamic_sampling and not self.dynamic_sampling:
            raise ValueError(f"dynamic_sampling: {why}; groups of equal rewards carry gradient there, set it to null")
        if self.loss_types is not None and loss_type not in self.loss_types:
            raise ValueError(
                f"loss_type: objective {self.name} {self.loss_why}; loss_type {loss_type} weights the completions "
                f"otherwise, use {' or '.join(self.loss_types)}"
            )
        if beta != 0 and not self.kl:
            raise ValueError(f"beta: objective {self.name} has no KL term; a KL penalty changes its gradient, use 0")
        if self.reward is None:
            return
        if self.reward not in weights:
            raise ValueError(f"rewards: {why}; add {self.reward}")
        for name, weight in weights.items():
            if name != self.reward and weight != 0:
                raise ValueError(f"rewards.{name}: {why}; set its weight to 0 or remove it")


def _trainers(algorithms: Sequence[str]) -> str:
    trainers = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}
    return " or ".join(trainers.get(a, a) for a in algorithms)


OBJECTIVES: dict[str, Objective] = {}
"""The registered objectives by name, in registration order."""


def register_objective(name: str, **constraints: Any) -> Callable[[AdvantageFn], AdvantageFn]:
    """Register the decorated advantage function as objective `name`, with `constraints` (Objective's fields)."""

    def add(func: AdvantageFn) -> AdvantageFn:
        if name in OBJECTIVES:
            raise ValueError(f"objective {name!r} is registered twice")
        OBJECTIVES[name] = Objective(name, func, **constraints)
        return func

    return add


def of_function(func: AdvantageFn) -> Objective | None:
    """The registration of `func` (an objective given by its import path may be registered where it is defined)."""
    return next((o for o in OBJECTIVES.values() if o.advantages is func), None)
