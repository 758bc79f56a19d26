"""The RL objectives of Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
Reasoning" (arXiv:2506.01347), as advantage functions for TRL's GRPOTrainer.

With rewards r = +1 (correct) / -1 (wrong) and no baseline, REINFORCE's loss splits in two:
    L_PSR = -E_x[ sum_{y: r=+1} pi(y|x) ]   (positive sample reinforcement: raise the correct ones)
    L_NSR = -E_x[ sum_{y: r=-1} -pi(y|x) ]  (negative sample reinforcement: lower the wrong ones)
and W-REINFORCE = lambda * L_PSR + L_NSR (the paper's lambda = 0.1). On samples drawn from pi, their
gradients are those of TRL's policy loss -A * log pi(y|x) with the advantage A(y) = +1 / 0 (psr),
0 / -1 (nsr) or lambda / -1 (w_reinforce) for a correct / wrong y: so the objective replaces the
advantage TRL computed and leaves TRL's loss (clipping, token normalisation) alone. That holds for
TRL's token mean over the batch (loss_type dapo) without a KL term: their registrations refuse other
loss types (grpo divides each completion by its length) and beta > 0.
No library provides these objectives (TRL's advantages are group-relative).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rung.objectives.registry import register_objective

if TYPE_CHECKING:
    from torch import Tensor

SIGNS = {"psr": (1.0, 0.0), "nsr": (0.0, -1.0), "w_reinforce": (None, -1.0)}
"""(advantage of a correct, of a wrong completion) per objective; w_reinforce's correct one is its lambda."""

# The paper's recipe: token-level loss, no KL, the accuracy reward alone.
_CONSTRAINTS: dict[str, Any] = {
    "trains_on": "trains on the accuracy reward's sign alone",
    "reward": "accuracy",
    "algorithms": ("grpo",),
    # the paper's gradient: sum over completions of A(y) * grad log pi(y), over the batch's token count
    # (tests/test_objectives.py checks it for loss_type dapo); other aggregations reweight completions
    "loss_types": ("dapo",),
    "loss_why": "trains on the paper's token mean over the batch",
    "kl": False,
    "dynamic_sampling": False,
    "preset": {"loss_type": "dapo", "beta": 0.0, "epsilon": 0.2, "epsilon_high": None},
}


def signed_advantages(accuracy: Tensor, objective: str, positive_weight: float = 0.1) -> Tensor:
    """The advantage of each completion from its accuracy reward (1 correct, 0 wrong, NaN unscored:
    advantage 0) under objective psr, nsr or w_reinforce (its lambda = positive_weight)."""
    if objective not in SIGNS:
        raise ValueError(f"objective must be one of {tuple(SIGNS)}, got {objective!r}")
    positive, negative = SIGNS[objective]
    correct = accuracy > 0.5
    advantages = accuracy.new_full(accuracy.shape, negative).masked_fill(
        correct, positive_weight if positive is None else positive
    )
    return advantages.masked_fill(accuracy.isnan(), 0.0)


def _accuracy(rewards: Tensor, reward_names: Sequence[str]) -> Tensor:
    return rewards[:, list(reward_names).index("accuracy")]


@register_objective("psr", **_CONSTRAINTS)
def psr(
    rewards: Tensor, reward_names: Sequence[str], trl: Tensor, group_size: int, settings: Mapping[str, Any]
) -> Tensor:
    """Positive sample reinforcement: +1 for a correct completion, 0 for a wrong one."""
    return signed_advantages(_accuracy(rewards, reward_names), "psr")


@register_objective("nsr", **_CONSTRAINTS)
def nsr(
    rewards: Tensor, reward_names: Sequence[str], trl: Tensor, group_size: int, settings: Mapping[str, Any]
) -> Tensor:
    """Negative sample reinforcement: 0 for a correct completion, -1 for a wrong one."""
    return signed_advantages(_accuracy(rewards, reward_names), "nsr")


@register_objective("w_reinforce", **_CONSTRAINTS)
def w_reinforce(
    rewards: Tensor, reward_names: Sequence[str], trl: Tensor, group_size: int, settings: Mapping[str, Any]
) -> Tensor:
    """lambda * PSR + NSR: positive_weight (lambda) for a correct completion, -1 for a wrong one."""
    return signed_advantages(_accuracy(rewards, reward_names), "w_reinforce", settings["positive_weight"])
