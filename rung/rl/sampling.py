"""Which prompts a GRPO-family trainer trains on: drawn from a rung.rl.curricula scheduler at each
generation batch, with DAPO's dynamic sampling (TRL issue #3708), and the scheduler's state saved in
and restored from each checkpoint.

Touches no TRL internals: it overrides the hooks of rung.train.trl_seam (`generation_batch`, `scored`,
`save_rung_state`, `load_rung_state`), which calls them from TRL's private methods.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from rung import files
from rung.config import DynamicSamplingParams
from rung.rl import curricula
from rung.rl.advantages import Advantages
from rung.train.checkpoints import CURRICULUM_STATE
from rung.train.trl_seam import Generated, nanstd, train_metrics


class CurriculumSampling:
    """Prompt selection by a rung.rl.curricula scheduler and DAPO dynamic sampling for a TRL
    GRPO-family trainer (a mixin in front of rung.train.trl_seam's GRPOSeam / RLOOSeam).

    TRL's sampler still paces the steps, but each generation batch's prompts are drawn from the
    curriculum at the moment it is generated (no prefetch lag). All processes draw the same global
    batch and take their slice, so groups never straddle processes. Dynamic sampling drops groups
    whose rewards are all equal and generates replacements from newly drawn prompts, at most
    `max_rounds` times; a batch still short is topped up with dropped groups (no gradient).

    Logged per step: TRL's `reward`, `reward_std` and `rewards/<func>/mean|std` describe the groups
    trained on; `reward_generated` and `rewards_generated/<func>/mean` everything generated (the
    same without dynamic sampling); `dynamic_sampling/*` the groups dropped for zero variance
    (their share of what was generated) and the extra completions the refills cost.

    The advantages of every generated batch are the stage's objective's (rung.objectives: TRL's own
    under group_relative), in the batch and in TRL's completions log. The curricula's learnability
    signal stays TRL's own advantage (group-relative, or RLOO's leave-one-out) whatever the objective,
    so that it means the same under each.

    A completion one of the rewards crashed on (rung.rl.rewards.Guarded) is unscored as a whole: NaN
    for every reward, which TRL leaves out of its group's baseline and trains with advantage 0.

    Checkpoints carry the curriculum's state (and, through the seam, TRL's generation cycle), so
    that a resumed run trains on what an unkilled one would.
    """

    def __init__(
        self,
        *args: Any,
        curriculum: curricula.Scheduler,
        rows: list[dict[str, Any]],
        dynamic_sampling: DynamicSamplingParams | None,
        advantages: Advantages,
        **kwargs: Any,
    ) -> None:
        """TRL's trainer arguments, plus the curriculum drawing from `rows` (the dataset's rows), dynamic
        sampling (None: off) and the advantages trained with (rl.stages.<name>.objective)."""
        super().__init__(*args, **kwargs)
        self.curriculum, self.rows, self.dynamic, self.advantages = curriculum, rows, dynamic_sampling, advantages

    def scored(self, rewards: torch.Tensor, prompts: list[Any]) -> torch.Tensor:
        out = super().scored(rewards, prompts)  # type: ignore[misc]
        # A crashed grader's NaN alone would leave the row scored by the other rewards, as if the crashed
        # one had given 0: the whole row is unscored instead (out of the baseline, advantage 0).
        crashed = torch.zeros(len(prompts), dtype=torch.int32, device=out.device)
        for func in self.reward_funcs:
            crashed[torch.tensor(getattr(func, "crashed", []), dtype=torch.long)] = 1
        out[self.accelerator.gather(crashed).bool()] = torch.nan
        return out

    def _generate_scored(self, inputs: list[dict[str, Any]]) -> Generated:
        """TRL's generation and scoring of one batch, its advantages the objective's (`Generated.advantages`
        stays TRL's: the curricula's learnability signal, _score_groups)."""
        generated = self.scored_generation_batch(inputs)  # type: ignore[attr-defined]
        out = generated.batch
        advantages = self.advantages(
            generated.rewards, self.reward_func_names, generated.advantages, self.num_generations
        )
        local = len(out["advantages"])  # TRL's slice of the gathered batch for this process
        start = self.accelerator.process_index * local
        out["advantages"] = advantages[start : start + local].to(out["advantages"].device)
        # TRL logged its own (gathered) advantages for the completions table: log those trained with
        self.relog_advantages(advantages.tolist())  # type: ignore[attr-defined]
        return generated

    def _draw(self, n_local: int) -> tuple[list[int], list[dict[str, Any]]]:
        world, rank, g = self.accelerator.num_processes, self.accelerator.process_index, self.num_generations
        prompts_local = n_local // g
        global_idx = self.curriculum.draw(prompts_local * world, step=self.state.global_step)
        train_metrics(self)["curriculum/prompts"].append(float(len(set(global_idx))))
        mine = global_idx[rank * prompts_local : (rank + 1) * prompts_local]
        return global_idx, [self.train_dataset[i] for i in mine for _ in range(g)]

    def _score_groups(
        self, global_idx: list[int], generated: Generated
    ) -> tuple[list[curricula.GroupResult], torch.Tensor]:
        """Per-group results of a generation (all processes) and a zero-variance flag per group
        (over its scored completions; a group with none has zero variance)."""
        g = self.num_generations
        r = generated.rewards
        weights = self.reward_weights.to(r.device)
        unscored = torch.isnan(r).all(dim=1).view(-1, g)
        total = (r * weights).nansum(dim=1).view(-1, g).masked_fill(unscored, torch.nan)
        acc = (
            r[:, self.reward_func_names.index("accuracy")].view(-1, g)
            if "accuracy" in self.reward_func_names
            else total
        )
        # TRL's advantage, not the objective's: a signed one's |A| is the accuracy under PSR, 1 - it under NSR
        adv = generated.advantages.view(-1, g)
        std = nanstd(total, dim=1)
        highest = total.masked_fill(unscored, -torch.inf).max(dim=1).values
        lowest = total.masked_fill(unscored, torch.inf).min(dim=1).values
        zero = torch.isclose(highest, lowest) | unscored.all(dim=1)
        # a group no grader scored tells the curriculum nothing (its accuracy is NaN)
        results = [
            curricula.GroupResult(index=i, accuracy=a, reward_std=s, abs_advantage=v)
            for i, a, s, v in zip(
                global_idx, acc.nanmean(dim=1).tolist(), std.tolist(), adv.abs().mean(dim=1).tolist(), strict=True
            )
            if not math.isnan(a)
        ]
        return results, zero

    def generation_batch(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        if not self.model.training:
            return super().generation_batch(inputs)  # type: ignore[misc]
        g, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        n_local = len(inputs)
        metrics = train_metrics(self)
        marks = {k: len(metrics[k]) for k in self._reward_names()}
        global_idx, inputs = self._draw(n_local)
        generated = self._generate_scored(inputs)
        results, zero = self._score_groups(global_idx, generated)
        self._log_buckets(results)
        self.curriculum.update(results, step=self.state.global_step)
        for key, value in self.curriculum.metrics().items():
            metrics[f"curriculum/{key}"].append(float(value))
        if self.dynamic is None:
            metrics["frac_zero_std_trained"].append(zero.float().mean().item())
            # everything generated is trained on
            self._log_rewards(generated.rewards, generated.rewards, marks)
            return generated.batch
        return self._refill(generated, zero, n_local // g, world, rank, marks)

    def _refill(
        self, first: Generated, zero: torch.Tensor, per_rank: int, world: int, rank: int, marks: dict[str, int]
    ) -> dict[str, Any]:
        g = self.num_generations
        Group = tuple[dict[str, Any], int, torch.Tensor]  # (generation output, local group index, its reward rows)
        kept: list[list[Group]] = [[] for _ in range(world)]  # per rank
        dropped: list[list[Group]] = [[] for _ in range(world)]
        rewards = [first.rewards]  # of every generation call

        def sort(generated: Generated, zero: torch.Tensor) -> None:
            for j, z in enumerate(zero.tolist()):
                owner, local = divmod(j, per_rank)
                (dropped if z else kept)[owner].append((generated.batch, local, generated.rewards[j * g : (j + 1) * g]))

        sort(first, zero)
        generated, zero_groups, rounds = len(zero), int(zero.sum()), 0
        while rounds < self.dynamic.max_rounds and min(len(k) for k in kept) < per_rank:
            rounds += 1
            global_idx, inputs = self._draw(per_rank * g)
            more = self._generate_scored(inputs)
            rewards.append(more.rewards)
            results, more_zero = self._score_groups(global_idx, more)
            self.curriculum.update(results, step=self.state.global_step)
            sort(more, more_zero)
            generated += len(more_zero)
            zero_groups += int(more_zero.sum())
        trained = [(kept[r] + dropped[r])[:per_rank] for r in range(world)]  # every rank's batch
        trained_zero = sum(min(per_rank, max(0, per_rank - len(k))) for k in kept)  # zero-variance groups topped up
        metrics = train_metrics(self)
        metrics["dynamic_sampling/rounds"].append(float(rounds))
        metrics["dynamic_sampling/zero_std_generated"].append(zero_groups / generated)
        metrics["dynamic_sampling/dropped_share"].append(
            (zero_groups - trained_zero) / generated
        )  # generated, not trained on
        metrics["dynamic_sampling/extra_generations"].append(
            float((generated - per_rank * world) * g)
        )  # completions beyond one batch
        metrics["frac_zero_std_trained"].append(trained_zero / (per_rank * world))
        self._log_rewards(torch.cat([r for batch in trained for _, _, r in batch]), torch.cat(rewards), marks)
        return self.concat_groups([(batch, j) for batch, j, _ in trained[rank]])  # type: ignore[attr-defined]

    def save_rung_state(self, checkpoint: Path) -> None:
        if self.args.should_save:
            files.write_json(checkpoint / CURRICULUM_STATE, self.curriculum.state_dict())
        super().save_rung_state(checkpoint)  # type: ignore[misc]

    def load_rung_state(self, checkpoint: Path) -> None:
        super().load_rung_state(checkpoint)  # type: ignore[misc]
        if (checkpoint / CURRICULUM_STATE).exists():
            self.curriculum.load_state_dict(files.read_json(checkpoint / CURRICULUM_STATE))
