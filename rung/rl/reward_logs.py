"""Per-step reward metrics of a trainer with dynamic sampling: TRL's `reward`, `reward_std` and
`rewards/<func>/*` rewritten to describe the groups trained on, the same for everything generated
logged apart (`reward_generated`, `rewards_generated/<func>/mean`), and accuracy per difficulty bucket."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

import torch

from rung.rl import curricula
from rung.train.trl_private import nanstd


class RewardLog:
    """The reward-logging part of rung's RL trainers (rung.rl.sampling.BatchSource calls it): writes into
    `metrics`, the dict of the step's metrics TRL averages into each training log (rung.train.trl_private)."""

    def __init__(
        self, names: list[str], weights: torch.Tensor, buckets: list[str], metrics: defaultdict[str, list[float]]
    ) -> None:
        """`names` and `weights` of the reward functions, as TRL's trainer has them; `buckets`: each prompt's
        difficulty bucket, by its index in the dataset."""
        self.names, self.weights, self.buckets, self.metrics = names, weights, buckets, metrics

    def keys(self) -> list[str]:
        """TRL's reward log keys that rung rewrites to describe the trained groups only."""
        return ["reward", "reward_std", *(f"rewards/{n}/{s}" for n in self.names for s in ("mean", "std"))]

    def mark(self) -> dict[str, int]:
        """Where this step's entries of TRL's reward keys start from now on (for `rewards`)."""
        return {key: len(self.metrics[key]) for key in self.keys()}

    def total(self, rewards: torch.Tensor) -> torch.Tensor:
        """The reward of each row of (completions, reward funcs) as TRL computes it: the weighted sum of
        those scored, NaN for a row no function scored."""
        t = (rewards * self.weights.to(rewards.device)).nansum(dim=1)
        t[torch.isnan(rewards).all(dim=1)] = torch.nan
        return t

    def rewards(self, trained: torch.Tensor, generated: torch.Tensor, marks: dict[str, int]) -> None:
        """Replace this step's TRL reward entries (one per generation call, from `marks` on) by those
        of the trained rows, and log the reward of every generated row apart. Rows: (completions,
        reward funcs)."""
        metrics = self.metrics
        for key, mark in marks.items():
            del metrics[key][mark:]
        metrics["reward"].append(torch.nanmean(self.total(trained)).item())
        metrics["reward_std"].append(nanstd(self.total(trained)).item())
        metrics["reward_generated"].append(torch.nanmean(self.total(generated)).item())
        for i, name in enumerate(self.names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(trained[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(trained[:, i]).item())
            metrics[f"rewards_generated/{name}/mean"].append(torch.nanmean(generated[:, i]).item())

    def accuracy_by_bucket(self, results: list[curricula.GroupResult]) -> None:
        by_bucket: dict[str, list[float]] = defaultdict(list)
        for r in results:
            by_bucket[self.buckets[r.index]].append(r.accuracy)
        for name, accs in by_bucket.items():
            self.metrics[f"accuracy_by_bucket/{name}"].append(mean(accs))
