"""Which prompts a GRPO-family trainer trains on: drawn from a rung.rl.curricula scheduler at each
generation batch, with DAPO's dynamic sampling (TRL issue #3708), and the scheduler's state saved in
and restored from each checkpoint.

The batch-source part of rung's RL trainers: rung.train.trl_seam's hooks call it with values (the step,
TRL's generation of a batch, the rewards); it reads nothing of the trainer.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather
from datasets import Dataset

from rung import files
from rung.config import DynamicSamplingParams
from rung.rl import curricula
from rung.rl.reward_logs import RewardLog
from rung.rl.rewards import Guarded
from rung.train.checkpoints import CURRICULUM_STATE
from rung.train.parts import Concat, Generate, Generated
from rung.train.trl_private import nanstd


class BatchSource:
    """Prompt selection by a rung.rl.curricula scheduler and DAPO dynamic sampling for a TRL
    GRPO-family trainer (rung.train.parts' `Batches`).

    TRL's sampler still paces the steps, but each generation batch's prompts are drawn from the
    curriculum at the moment it is generated (no prefetch lag). All processes draw the same global
    batch and take their slice, so groups never straddle processes. Dynamic sampling drops groups
    whose rewards are all equal and generates replacements from newly drawn prompts, at most
    `max_rounds` times; a batch still short is topped up with dropped groups (no gradient).

    Logged per step: TRL's `reward`, `reward_std` and `rewards/<func>/mean|std` describe the groups
    trained on; `reward_generated` and `rewards_generated/<func>/mean` everything generated (the
    same without dynamic sampling); `dynamic_sampling/*` the groups dropped for zero variance
    (their share of what was generated) and the extra completions the refills cost.

    The trainer's `generate` gives every generated batch the stage's objective's advantages (its advantage
    part, rung.rl.advantages). The curricula's learnability signal stays TRL's own advantage
    (group-relative, or RLOO's leave-one-out: `Generated.advantages`) whatever the objective, so that it
    means the same under each.

    A completion one of the rewards crashed on (rung.rl.rewards.Guarded) is unscored as a whole: NaN
    for every reward, which TRL leaves out of its group's baseline and trains with advantage 0.

    Checkpoints carry the curriculum's state (and, through the seam, TRL's generation cycle), so
    that a resumed run trains on what an unkilled one would.
    """

    def __init__(
        self,
        curriculum: curricula.Scheduler,
        dataset: Dataset,
        dynamic_sampling: DynamicSamplingParams | None,
        num_generations: int,
        world: int,
        rank: int,
        reward_funcs: Sequence[Guarded],
        log: RewardLog,
    ) -> None:
        """The curriculum drawing from `dataset` (the trainer's rows, by index), dynamic sampling (None: off),
        the trainer's group size, processes and this one's rank, its reward functions (whose crashes are
        unscored) and the reward log, whose metrics sink this part logs into too."""
        self.curriculum, self.dataset, self.dynamic = curriculum, dataset, dynamic_sampling
        self.g, self.world, self.rank = num_generations, world, rank
        self.reward_funcs, self.log = reward_funcs, log
        self.metrics: defaultdict[str, list[float]] = log.metrics
        self.gold: torch.Tensor | None = None
        """The verifier's grade of every process's rows of the last scored batch, where a learned reward logs it
        (NaN where the grader failed)."""

    def scored(self, rewards: torch.Tensor, rows: int) -> torch.Tensor:
        """TRL's rewards of every process's rows, this process's `rows` of them unscored where a reward crashed."""
        # A crashed grader's NaN alone would leave the row scored by the other rewards, as if the crashed
        # one had given 0: the whole row is unscored instead (out of the baseline, advantage 0).
        crashed = torch.zeros(rows, dtype=torch.int32, device=rewards.device)
        for func in self.reward_funcs:
            crashed[torch.tensor(func.crashed, dtype=torch.long)] = 1
        rewards[gather(crashed).bool()] = torch.nan
        graded = next((f.gold for f in self.reward_funcs if f.gold is not None), None)
        if graded is not None:
            grades = [math.nan if g is None else g for g in graded]
            self.gold = gather(torch.tensor(grades, dtype=torch.float, device=rewards.device))
        return rewards

    def batch(self, size: int, step: int, generate: Generate, concat: Concat) -> dict[str, Any]:
        """This process's `size` rows of a training batch at `step`: prompts drawn from the curriculum, made
        into a scored batch by `generate`; under dynamic sampling, groups from several such batches joined
        by `concat`."""
        marks = self.log.mark()
        global_idx, inputs = self._draw(size, step)
        generated = generate(inputs)
        results, zero = self._score_groups(global_idx, generated)
        self.log.accuracy_by_bucket(results if self.gold is None else self._gold_results(global_idx))
        self.curriculum.update(results, step=step)
        for key, value in self.curriculum.metrics().items():
            self.metrics[f"curriculum/{key}"].append(float(value))
        if self.dynamic is None:
            self.metrics["frac_zero_std_trained"].append(zero.float().mean().item())
            # everything generated is trained on
            self.log.rewards(generated.rewards, generated.rewards, marks)
            return generated.batch
        return self._refill(generated, zero, size // self.g, self.dynamic.max_rounds, step, generate, concat, marks)

    def _draw(self, n_local: int, step: int) -> tuple[list[int], list[dict[str, Any]]]:
        g, prompts_local = self.g, n_local // self.g
        global_idx = self.curriculum.draw(prompts_local * self.world, step=step)
        self.metrics["curriculum/prompts"].append(float(len(set(global_idx))))
        mine = global_idx[self.rank * prompts_local : (self.rank + 1) * prompts_local]
        return global_idx, [self.dataset[i] for i in mine for _ in range(g)]

    def _score_groups(
        self, global_idx: list[int], generated: Generated
    ) -> tuple[list[curricula.GroupResult], torch.Tensor]:
        """Per-group results of a generation (all processes) and a zero-variance flag per group
        (over its scored completions; a group with none has zero variance)."""
        g, names = self.g, self.log.names
        r = generated.rewards
        unscored = torch.isnan(r).all(dim=1).view(-1, g)
        total = self.log.total(r).view(-1, g)
        acc = r[:, names.index("accuracy")].view(-1, g) if "accuracy" in names else total
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

    def _gold_results(self, global_idx: list[int]) -> list[curricula.GroupResult]:
        """Each group's verifier accuracy (the gold grade a learned reward logs, None: NaN), for the accuracy by
        bucket only: the curricula read what the stage trains on, since the gold grade must never steer training."""
        accuracy = self.gold.view(-1, self.g).nanmean(dim=1).tolist() if self.gold is not None else []
        return [
            curricula.GroupResult(index=i, accuracy=a, reward_std=math.nan, abs_advantage=math.nan)
            for i, a in zip(global_idx, accuracy, strict=True)
            if not math.isnan(a)
        ]

    def _refill(
        self,
        first: Generated,
        zero: torch.Tensor,
        per_rank: int,
        max_rounds: int,
        step: int,
        generate: Generate,
        concat: Concat,
        marks: dict[str, int],
    ) -> dict[str, Any]:
        g, world = self.g, self.world
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
        while rounds < max_rounds and min(len(k) for k in kept) < per_rank:
            rounds += 1
            global_idx, inputs = self._draw(per_rank * g, step)
            more = generate(inputs)
            rewards.append(more.rewards)
            results, more_zero = self._score_groups(global_idx, more)
            self.curriculum.update(results, step=step)
            sort(more, more_zero)
            generated += len(more_zero)
            zero_groups += int(more_zero.sum())
        trained = [(kept[r] + dropped[r])[:per_rank] for r in range(world)]  # every rank's batch
        trained_zero = sum(min(per_rank, max(0, per_rank - len(k))) for k in kept)  # zero-variance groups topped up
        metrics = self.metrics
        metrics["dynamic_sampling/rounds"].append(float(rounds))
        metrics["dynamic_sampling/zero_std_generated"].append(zero_groups / generated)
        metrics["dynamic_sampling/dropped_share"].append(
            (zero_groups - trained_zero) / generated
        )  # generated, not trained on
        metrics["dynamic_sampling/extra_generations"].append(
            float((generated - per_rank * world) * g)
        )  # completions beyond one batch
        metrics["frac_zero_std_trained"].append(trained_zero / (per_rank * world))
        self.log.rewards(torch.cat([r for batch in trained for _, _, r in batch]), torch.cat(rewards), marks)
        return concat([(batch, j) for batch, j, _ in trained[self.rank]])

    def save(self, checkpoint: Path, main: bool) -> None:
        """Write the curriculum's state into `checkpoint` (`main`: this process writes the shared files)."""
        if main:
            files.write_json(checkpoint / CURRICULUM_STATE, self.curriculum.state_dict())

    def load(self, checkpoint: Path) -> None:
        """Restore the curriculum's state from `checkpoint`, where it has one."""
        if (checkpoint / CURRICULUM_STATE).exists():
            self.curriculum.load_state_dict(files.read_json(checkpoint / CURRICULUM_STATE))
