"""Per-step reward metrics of a trainer with dynamic sampling: TRL's `reward`, `reward_std` and
`rewards/<func>/*` rewritten to describe the groups trained on, the same for everything generated
logged apart (`reward_generated`, `rewards_generated/<func>/mean`), and accuracy per difficulty bucket."""

from __future__ import annotations

from collections import defaultdict
from statistics import mean

import torch

from rung.rl import curricula
from rung.train.trl_seam import nanstd, train_metrics


class RewardLogs:
    """Mixin for a TRL GRPO-family trainer whose `rows` carry each prompt's difficulty bucket."""

    def _reward_names(self) -> list[str]:
        """TRL's reward log keys that rung rewrites to describe the trained groups only."""
        return ["reward", "reward_std", *(f"rewards/{n}/{s}" for n in self.reward_func_names for s in ("mean", "std"))]

    def _log_rewards(self, trained: torch.Tensor, generated: torch.Tensor, marks: dict[str, int]) -> None:
        """Replace this step's TRL reward entries (one per generation call, from `marks` on) by those
        of the trained rows, and log the reward of every generated row apart. Rows: (completions,
        reward funcs), as TRL computes them (weighted sum; a row no function scored is NaN)."""
        metrics = train_metrics(self)
        for key, mark in marks.items():
            del metrics[key][mark:]
        weights = self.reward_weights.to(trained.device)

        def total(r: torch.Tensor) -> torch.Tensor:
            t = (r * weights).nansum(dim=1)
            t[torch.isnan(r).all(dim=1)] = torch.nan
            return t

        metrics["reward"].append(torch.nanmean(total(trained)).item())
        metrics["reward_std"].append(nanstd(total(trained)).item())
        metrics["reward_generated"].append(torch.nanmean(total(generated)).item())
        for i, name in enumerate(self.reward_func_names):
            metrics[f"rewards/{name}/mean"].append(torch.nanmean(trained[:, i]).item())
            metrics[f"rewards/{name}/std"].append(nanstd(trained[:, i]).item())
            metrics[f"rewards_generated/{name}/mean"].append(torch.nanmean(generated[:, i]).item())

    def _log_buckets(self, results: list[curricula.GroupResult]) -> None:
        by_bucket: dict[str, list[float]] = defaultdict(list)
        for r in results:
            by_bucket[self.rows[r.index].get("bucket", "unknown")].append(r.accuracy)
        for name, accs in by_bucket.items():
            train_metrics(self)[f"accuracy_by_bucket/{name}"].append(mean(accs))
