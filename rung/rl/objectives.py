"""The RL objectives of Zhu et al. 2025, "The Surprising Effectiveness of Negative Reinforcement in LLM
Reasoning" (arXiv:2506.01347), as an advantage transform on TRL's GRPOTrainer.

With rewards r = +1 (correct) / -1 (wrong) and no baseline, REINFORCE's loss splits in two:
    L_PSR = -E_x[ sum_{y: r=+1} pi(y|x) ]   (positive sample reinforcement: raise the correct ones)
    L_NSR = -E_x[ sum_{y: r=-1} -pi(y|x) ]  (negative sample reinforcement: lower the wrong ones)
and W-REINFORCE = lambda * L_PSR + L_NSR (the paper's lambda = 0.1). On samples drawn from pi, their
gradients are those of TRL's policy loss -A * log pi(y|x) with the advantage A(y) = +1 / 0 (psr),
0 / -1 (nsr) or lambda / -1 (w_reinforce) for a correct / wrong y: so the objective replaces the
advantage TRL computed and leaves TRL's loss (clipping, token normalisation) alone. That holds for
TRL's token mean over the batch (loss_type dapo) without a KL term: rung.config refuses other
loss types (grpo divides each completion by its length) and beta > 0 with these objectives.
No library provides these objectives (TRL's advantages are group-relative). rung.rl.sampling applies
the transform to every batch TRL generates and scores for training.
"""

from __future__ import annotations

import torch

from rung.config import SIGNED_OBJECTIVES


def signed_advantages(accuracy: torch.Tensor, objective: str, positive_weight: float = 0.1) -> torch.Tensor:
    """The advantage of each completion from its accuracy reward (1 correct, 0 wrong, NaN unscored:
    advantage 0) under objective psr, nsr or w_reinforce (its lambda = positive_weight)."""
    if objective not in SIGNED_OBJECTIVES:
        raise ValueError(f"objective must be one of {SIGNED_OBJECTIVES}, got {objective!r}")
    positive, negative = {"psr": (1.0, 0.0), "nsr": (0.0, -1.0), "w_reinforce": (positive_weight, -1.0)}[objective]
    correct = accuracy > 0.5
    advantages = torch.where(correct, positive, negative).to(accuracy.dtype)
    return torch.where(torch.isnan(accuracy), torch.zeros_like(advantages), advantages)
