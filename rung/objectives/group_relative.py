"""TRL's own advantage: each reward minus its group's mean, scaled per `scale_rewards` (GRPO), or RLOO's
leave-one-out baseline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rung.objectives.registry import register_objective

if TYPE_CHECKING:
    from torch import Tensor


@register_objective("group_relative")
def group_relative(
    rewards: Tensor, reward_names: Sequence[str], trl: Tensor, group_size: int, settings: Mapping[str, Any]
) -> Tensor:
    """The advantages TRL computed, unchanged."""
    return trl
