"""Which prompts a GRPO-family trainer trains on: drawn from a rung.rl.curricula scheduler at each
generation batch, with DAPO's dynamic sampling (TRL issue #3708), and the scheduler's state saved in
and restored from each checkpoint.

Overrides TRL 1.16's private `_generate_and_score_completions`, `_calculate_rewards`,
`_save_checkpoint` and `_load_optimizer_and_scheduler` (rung/compat.py lists them; tests/test_rl.py
and tests/test_compat.py cover them because private hooks can move), and reads and restores TRL's
generation cycle (`_step`, `_buffered_inputs`) and its completions log (`_logs`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from trl.trainer.utils import nanstd, pad

from rung import files
from rung.config import SIGNED_OBJECTIVES, DynamicSamplingParams
from rung.rl import curricula, objectives
from rung.train.checkpoints import CURRICULUM_STATE, generation_state


class CurriculumSampling:
    """Prompt selection by a rung.rl.curricula scheduler and DAPO dynamic sampling for a TRL
    GRPO-family trainer.

    TRL's sampler still paces the steps, but each generation batch's prompts are drawn from the
    curriculum at the moment it is generated (no prefetch lag). All processes draw the same global
    batch and take their slice, so groups never straddle processes. Dynamic sampling drops groups
    whose rewards are all equal and generates replacements from newly drawn prompts, at most
    `max_rounds` times; a batch still short is topped up with dropped groups (no gradient).

    Logged per step: TRL's `reward`, `reward_std` and `rewards/<func>/mean|std` describe the groups
    trained on; `reward_generated` and `rewards_generated/<func>/mean` everything generated (the
    same without dynamic sampling); `dynamic_sampling/*` the groups dropped for zero variance
    (their share of what was generated) and the extra completions the refills cost.

    Under a signed objective (psr, nsr, w_reinforce: rung.rl.objectives) the advantages of every
    generated batch are replaced by the objective's, from the accuracy reward of each completion, in
    the batch and in TRL's completions log. The curricula's learnability signal stays TRL's own
    advantage (group-relative, or RLOO's leave-one-out) whatever the objective, so that it means the
    same under each.

    A completion one of the rewards crashed on (rung.rl.rewards.Guarded) is unscored as a whole: NaN
    for every reward, which TRL leaves out of its group's baseline and trains with advantage 0.

    Checkpoints carry the curriculum's state and, per process, TRL's generation cycle: with
    num_iterations > 1 a batch is trained on over several steps, and a checkpoint in the middle of
    that cycle keeps it, so that a resumed run trains on what an unkilled one would.
    """

    objective: str = "group_relative"
    positive_weight: float = 0.1

    def setup_curriculum(
        self, scheduler: curricula.Scheduler, rows: list[dict[str, Any]], dynamic: DynamicSamplingParams | None
    ) -> None:
        self.curriculum, self.rows, self.dynamic = scheduler, rows, dynamic
        self._last_rewards: torch.Tensor | None = None

    def setup_objective(self, objective: str, positive_weight: float) -> None:
        """The advantage the trainer trains with (rl.stages.<name>.objective and its positive_weight)."""
        self.objective, self.positive_weight = objective, positive_weight

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # A crashed grader's NaN alone would leave the row scored by the other rewards, as if the crashed
        # one had given 0: the whole row is unscored instead (out of the baseline, advantage 0).
        crashed = torch.zeros(len(prompts), dtype=torch.int32, device=out.device)
        for func in self.reward_funcs:
            crashed[torch.tensor(getattr(func, "crashed", []), dtype=torch.long)] = 1
        out[self.accelerator.gather(crashed).bool()] = torch.nan
        self._last_rewards = out  # (global batch, reward funcs), gathered across processes
        return out

    def _generate_scored(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        """TRL's generation and scoring of one batch; under a signed objective, its advantages replaced."""
        out = super()._generate_and_score_completions(inputs)  # type: ignore[misc]
        self._trl_advantages = out["advantages"]  # the curricula's learnability signal (_score_groups)
        if self.objective in SIGNED_OBJECTIVES:
            accuracy = self._last_rewards[:, self.reward_func_names.index("accuracy")]
            local = len(out["advantages"])  # TRL's slice of the gathered batch for this process
            start = self.accelerator.process_index * local
            signed = objectives.signed_advantages(accuracy, self.objective, self.positive_weight)
            out["advantages"] = signed[start : start + local].to(out["advantages"].device)
            # TRL logged its own (gathered) advantages for the completions table: log those trained with
            logged = self._logs["advantages"]
            for _ in range(len(signed)):
                logged.pop()
            logged.extend(signed.tolist())
        return out

    def _draw(self, n_local: int) -> tuple[list[int], list[dict[str, Any]]]:
        world, rank, g = self.accelerator.num_processes, self.accelerator.process_index, self.num_generations
        prompts_local = n_local // g
        global_idx = self.curriculum.draw(prompts_local * world, step=self.state.global_step)
        self._metrics["train"]["curriculum/prompts"].append(float(len(set(global_idx))))
        mine = global_idx[rank * prompts_local : (rank + 1) * prompts_local]
        return global_idx, [self.train_dataset[i] for i in mine for _ in range(g)]

    def _score_groups(self, global_idx: list[int]) -> tuple[list[curricula.GroupResult], torch.Tensor]:
        """Per-group results of the last generation (all processes) and a zero-variance flag per group
        (over its scored completions; a group with none has zero variance)."""
        g = self.num_generations
        r = self._last_rewards
        weights = self.reward_weights.to(r.device)
        unscored = torch.isnan(r).all(dim=1).view(-1, g)
        total = (r * weights).nansum(dim=1).view(-1, g).masked_fill(unscored, torch.nan)
        acc = (
            r[:, self.reward_func_names.index("accuracy")].view(-1, g)
            if "accuracy" in self.reward_func_names
            else total
        )
        # TRL's advantage, not the objective's: a signed one's |A| is the accuracy under PSR, 1 - it under NSR
        adv = self.accelerator.gather(self._trl_advantages).view(-1, g)
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

    def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        g, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        n_local = len(inputs)
        marks = {k: len(self._metrics["train"][k]) for k in self._reward_names()}
        global_idx, inputs = self._draw(n_local)
        out = self._generate_scored(inputs)
        results, zero = self._score_groups(global_idx)
        self._log_buckets(results)
        self.curriculum.update(results, step=self.state.global_step)
        for key, value in self.curriculum.metrics().items():
            self._metrics["train"][f"curriculum/{key}"].append(float(value))
        if self.dynamic is None:
            self._metrics["train"]["frac_zero_std_trained"].append(zero.float().mean().item())
            self._log_rewards(self._last_rewards, self._last_rewards, marks)  # everything generated is trained on
            return out
        return self._refill(out, zero, n_local // g, world, rank, marks)

    def _refill(
        self, out: dict[str, Any], zero: torch.Tensor, per_rank: int, world: int, rank: int, marks: dict[str, int]
    ) -> dict[str, Any]:
        g = self.num_generations
        Group = tuple[dict[str, Any], int, torch.Tensor]  # (generation output, local group index, its reward rows)
        kept: list[list[Group]] = [[] for _ in range(world)]  # per rank
        dropped: list[list[Group]] = [[] for _ in range(world)]
        rewards = [self._last_rewards]  # of every generation call

        def sort(out: dict[str, Any], zero: torch.Tensor) -> None:
            for j, z in enumerate(zero.tolist()):
                owner, local = divmod(j, per_rank)
                (dropped if z else kept)[owner].append((out, local, rewards[-1][j * g : (j + 1) * g]))

        sort(out, zero)
        generated, zero_groups, rounds = len(zero), int(zero.sum()), 0
        while rounds < self.dynamic.max_rounds and min(len(k) for k in kept) < per_rank:
            rounds += 1
            global_idx, inputs = self._draw(per_rank * g)
            more = self._generate_scored(inputs)
            rewards.append(self._last_rewards)
            results, more_zero = self._score_groups(global_idx)
            self.curriculum.update(results, step=self.state.global_step)
            sort(more, more_zero)
            generated += len(more_zero)
            zero_groups += int(more_zero.sum())
        trained = [(kept[r] + dropped[r])[:per_rank] for r in range(world)]  # every rank's batch
        trained_zero = sum(min(per_rank, max(0, per_rank - len(k))) for k in kept)  # zero-variance groups topped up
        metrics = self._metrics["train"]
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
        return self._merge(trained[rank])

    def _merge(self, chosen: list[tuple[dict[str, Any], int, torch.Tensor]]) -> dict[str, Any]:
        """Concatenate the chosen groups' rows from several generation outputs (re-padded)."""
        g, pad_id = self.num_generations, self.processing_class.pad_token_id
        merged: dict[str, Any] = {}
        for key, first in chosen[0][0].items():
            if key == "num_items_in_batch" or not isinstance(first, torch.Tensor):
                continue
            rows = [row for out, j, _ in chosen for row in out[key][j * g : (j + 1) * g]]
            if first.dim() == 1:
                merged[key] = torch.stack(rows)
                continue
            value = pad_id if key.endswith("_ids") else 0
            merged[key] = pad(rows, padding_value=value, padding_side="left" if key.startswith("prompt") else "right")
        if "num_items_in_batch" in chosen[0][0]:
            mask = merged["completion_mask"] * merged.get("tool_mask", 1)
            merged["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        return merged

    def _save_checkpoint(self, model, trial):  # type: ignore[no-untyped-def]
        # rung's state first: TRL writes trainer_state.json last and then deletes the previous
        # checkpoint, so wherever a kill lands a complete checkpoint (rung.train.checkpoints) is left.
        checkpoint = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
        if self.args.should_save:
            files.write_json(checkpoint / CURRICULUM_STATE, self.curriculum.state_dict())
        # Every process its own slice of the batch; kept only in the middle of a cycle, where TRL reuses it
        # (the generation batch was made by the weights before this step's update: it cannot be regenerated).
        middle = self._step % (self.args.steps_per_generation * self.num_iterations)
        checkpoint.mkdir(parents=True, exist_ok=True)
        torch.save(
            {"step": self._step, "buffered": self._buffered_inputs if middle else None},
            checkpoint / generation_state(self.accelerator.process_index),
        )
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):  # type: ignore[no-untyped-def]
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        if (Path(checkpoint) / CURRICULUM_STATE).exists():
            self.curriculum.load_state_dict(files.read_json(Path(checkpoint) / CURRICULUM_STATE))
        cycle = Path(checkpoint) / generation_state(self.accelerator.process_index)
        if cycle.exists():
            state = torch.load(cycle, map_location=self.accelerator.device, weights_only=True)
            self._step, self._buffered_inputs = state["step"], state["buffered"]
