"""RL stages with TRL's GRPOTrainer or RLOOTrainer on verifiable rewards, plus what TRL lacks:
curriculum-driven prompt selection and DAPO dynamic sampling (TRL issue #3708).

Both hook TRL 1.16's private `_generate_and_score_completions` (one call per generation batch)
and `_calculate_rewards`; tests/test_rl.py covers them because private hooks can move.
"""
from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from pathlib import Path
from statistics import mean
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer
from trl.trainer.utils import nanstd, pad

from rung import compat, models, placement

from rung.answers import formats

from rung.rl import curricula

from rung import files

from rung.rl import rewards
from rung.config import DynamicSamplingParams, FormatParams, RLStageParams, SamplingParams
from rung.errors import InputError
from rung.eval.evaluate import grade
from rung.generate.api import generate, render
from rung.train.jobs import JobResult, RLJob, main
from rung.rl.rollouts import Rollouts
from rung.train.checkpoints import CURRICULUM_STATE, common_args, finalize, fit, train_loss

def prompts(rows: list[dict[str, Any]], fmt: FormatParams) -> Dataset:
    """Conversational prompts plus the columns the reward functions read."""
    return Dataset.from_list(
        [
            {
                "prompt": formats.prompt(r["prompt"], fmt),
                "prompt_text": r["prompt"],
                "answer": r["answer"],
                "task": r["task"],
                "meta": files.dumps(r["meta"]),
            }
            for r in rows
        ]
    )


# rung's stage fields that are TRL config fields under the same name.
_PASSTHROUGH = (
    "max_steps", "learning_rate", "num_generations", "num_iterations", "max_completion_length",
    "mask_truncated_completions", "temperature", "top_p", "beta", "loss_type", "epsilon", "epsilon_high",
    "scale_rewards", "importance_sampling_level", "top_entropy_quantile", "use_vllm", "vllm_mode",
)


def trl_config(stage: RLStageParams, weights: list[float], seed: int, work_dir: Path, dtype: str = "float32", key: str = "rl.stages.main",
               device: str = "auto") -> GRPOConfig | RLOOConfig:
    """TRL's GRPOConfig (or RLOOConfig) from a stage's params; TRL's own names pass straight through."""
    cls = RLOOConfig if stage.algorithm == "rloo" else GRPOConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    explicit = stage.model_fields_set
    unsupported = sorted(k for k in _PASSTHROUGH if k not in fields and k in explicit)
    if unsupported:
        raise InputError(f"{key}: {unsupported} are not settings of TRL's {cls.__name__} (algorithm {stage.algorithm})")
    unknown = sorted(set(stage.trl) - fields)
    if unknown:
        raise InputError(f"{key}.trl: {unknown} are not fields of TRL's {cls.__name__}")
    return cls(
        **common_args(seed, work_dir, dtype, stage.save_steps, device),
        **{k: getattr(stage, k) for k in _PASSTHROUGH if k in fields},
        # prompts_per_step counts over all processes (torchrun and accelerate set WORLD_SIZE)
        per_device_train_batch_size=stage.prompts_per_step // int(os.environ.get("WORLD_SIZE", "1")) * stage.num_generations,
        reward_weights=weights,
        lr_scheduler_type="constant",
        **stage.trl,
    )


class CurriculumMixin:
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
    """

    def setup_curriculum(self, scheduler: curricula.Scheduler, rows: list[dict[str, Any]], dynamic: DynamicSamplingParams | None) -> None:
        self.curriculum, self.rows, self.dynamic = scheduler, rows, dynamic
        self._last_rewards: torch.Tensor | None = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):  # type: ignore[no-untyped-def]
        out = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._last_rewards = out  # (global batch, reward funcs), gathered across processes
        return out

    def _draw(self, n_local: int) -> tuple[list[int], list[dict[str, Any]]]:
        world, rank, g = self.accelerator.num_processes, self.accelerator.process_index, self.num_generations
        prompts_local = n_local // g
        global_idx = self.curriculum.draw(prompts_local * world, step=self.state.global_step)
        self._metrics["train"]["curriculum/prompts"].append(float(len(set(global_idx))))
        mine = global_idx[rank * prompts_local:(rank + 1) * prompts_local]
        return global_idx, [self.train_dataset[i] for i in mine for _ in range(g)]

    def _reward_names(self) -> list[str]:
        """TRL's reward log keys that rung rewrites to describe the trained groups only."""
        return ["reward", "reward_std", *(f"rewards/{n}/{s}" for n in self.reward_func_names for s in ("mean", "std"))]

    def _log_rewards(self, trained: torch.Tensor, generated: torch.Tensor, marks: dict[str, int]) -> None:
        """Replace this step's TRL reward entries (one per generation call, from `marks` on) by those
        of the trained rows, and log the reward of every generated row apart. Rows: (completions,
        reward funcs), as TRL computes them (weighted sum; a row no function scored is NaN)."""
        metrics = self._metrics["train"]
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

    def _score_groups(self, global_idx: list[int], out: dict[str, Any]) -> tuple[list[curricula.GroupResult], torch.Tensor]:
        """Per-group results of the last generation (all processes) and a zero-variance flag per group."""
        g = self.num_generations
        r = self._last_rewards
        weights = self.reward_weights.to(r.device)
        total = (r * weights).nansum(dim=1).view(-1, g)
        acc = r[:, self.reward_func_names.index("accuracy")].view(-1, g) if "accuracy" in self.reward_func_names else total
        adv = self.accelerator.gather(out["advantages"]).view(-1, g)
        std = total.std(dim=1)
        zero = torch.isclose(total.max(dim=1).values, total.min(dim=1).values)
        results = [
            curricula.GroupResult(index=i, accuracy=float(a), reward_std=float(s), abs_advantage=float(v))
            for i, a, s, v in zip(global_idx, acc.nanmean(dim=1).tolist(), std.tolist(), adv.abs().mean(dim=1).tolist(), strict=True)
        ]
        return results, zero

    def _generate_and_score_completions(self, inputs):  # type: ignore[no-untyped-def]
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        g, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        n_local = len(inputs)
        marks = {k: len(self._metrics["train"][k]) for k in self._reward_names()}
        global_idx, inputs = self._draw(n_local)
        out = super()._generate_and_score_completions(inputs)
        results, zero = self._score_groups(global_idx, out)
        self._log_buckets(results)
        self.curriculum.update(results, step=self.state.global_step)
        for key, value in self.curriculum.metrics().items():
            self._metrics["train"][f"curriculum/{key}"].append(float(value))
        if self.dynamic is None:
            self._metrics["train"]["frac_zero_std_trained"].append(zero.float().mean().item())
            self._log_rewards(self._last_rewards, self._last_rewards, marks)  # everything generated is trained on
            return out
        return self._refill(out, zero, n_local // g, world, rank, marks)

    def _refill(self, out: dict[str, Any], zero: torch.Tensor, per_rank: int, world: int, rank: int, marks: dict[str, int]) -> dict[str, Any]:
        g = self.num_generations
        Group = tuple[dict[str, Any], int, torch.Tensor]  # (generation output, local group index, its reward rows)
        kept: list[list[Group]] = [[] for _ in range(world)]  # per rank
        dropped: list[list[Group]] = [[] for _ in range(world)]
        rewards = [self._last_rewards]  # of every generation call

        def sort(out: dict[str, Any], zero: torch.Tensor) -> None:
            for j, z in enumerate(zero.tolist()):
                owner, local = divmod(j, per_rank)
                (dropped if z else kept)[owner].append((out, local, rewards[-1][j * g:(j + 1) * g]))

        sort(out, zero)
        generated, zero_groups, rounds = len(zero), int(zero.sum()), 0
        while rounds < self.dynamic.max_rounds and min(len(k) for k in kept) < per_rank:
            rounds += 1
            global_idx, inputs = self._draw(per_rank * g)
            more = super()._generate_and_score_completions(inputs)
            rewards.append(self._last_rewards)
            results, more_zero = self._score_groups(global_idx, more)
            self.curriculum.update(results, step=self.state.global_step)
            sort(more, more_zero)
            generated += len(more_zero)
            zero_groups += int(more_zero.sum())
        trained = [(kept[r] + dropped[r])[:per_rank] for r in range(world)]  # every rank's batch
        trained_zero = sum(min(per_rank, max(0, per_rank - len(k))) for k in kept)  # zero-variance groups topped up
        metrics = self._metrics["train"]
        metrics["dynamic_sampling/rounds"].append(float(rounds))
        metrics["dynamic_sampling/zero_std_generated"].append(zero_groups / generated)
        metrics["dynamic_sampling/dropped_share"].append((zero_groups - trained_zero) / generated)  # generated, not trained on
        metrics["dynamic_sampling/extra_generations"].append(float((generated - per_rank * world) * g))  # completions beyond one batch
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
            rows = [row for out, j, _ in chosen for row in out[key][j * g:(j + 1) * g]]
            if first.dim() == 1:
                merged[key] = torch.stack(rows)
                continue
            value = pad_id if key.endswith("_ids") else 0
            merged[key] = pad(rows, padding_value=value, padding_side="left" if key.startswith("prompt") else "right")
        if "num_items_in_batch" in chosen[0][0]:
            mask = merged["completion_mask"] * merged.get("tool_mask", 1)
            merged["num_items_in_batch"] = self.accelerator.gather(mask.sum()).sum()
        return merged

    def _log_buckets(self, results: list[curricula.GroupResult]) -> None:
        by_bucket: dict[str, list[float]] = defaultdict(list)
        for r in results:
            by_bucket[self.rows[r.index].get("bucket", "unknown")].append(r.accuracy)
        for name, accs in by_bucket.items():
            self._metrics["train"][f"accuracy_by_bucket/{name}"].append(mean(accs))

    def _save_checkpoint(self, model, trial):  # type: ignore[no-untyped-def]
        # The curriculum state first: TRL writes trainer_state.json last and then deletes the previous
        # checkpoint, so wherever a kill lands a complete checkpoint (rung.train.checkpoints) is left.
        if self.args.should_save:
            files.write_json(Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}" / CURRICULUM_STATE, self.curriculum.state_dict())
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):  # type: ignore[no-untyped-def]
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and (Path(checkpoint) / CURRICULUM_STATE).exists():
            self.curriculum.load_state_dict(files.read_json(Path(checkpoint) / CURRICULUM_STATE))


class GRPO(CurriculumMixin, Rollouts, GRPOTrainer):
    pass


class RLOO(CurriculumMixin, Rollouts, RLOOTrainer):
    pass


class HeldOut(TrainerCallback):
    """Greedy accuracy of the policy on the held-out split every `every` steps and at the last one,
    logged with that step's metrics as `heldout/accuracy`: a learning curve on data the stage never
    trains on, graded as the eval stage grades (rung.eval.evaluate). Every process generates the same
    greedy completions (so sharded models work); the main process logs them."""

    def __init__(self, trainer: Any, rows: list[dict[str, Any]], fmt: FormatParams, sampling: SamplingParams, every: int, tok: Any):
        self.trainer, self.rows, self.fmt, self.sampling, self.every, self.tok = trainer, rows, fmt, sampling, every, tok
        self.prompts = render(tok, [formats.prompt(r["prompt"], fmt) for r in rows])

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if state.global_step % self.every and state.global_step != state.max_steps:
            return
        was_training = model.training
        model.eval()
        with torch.no_grad():
            records = grade(self.rows, generate(model, self.tok, self.prompts, self.sampling, desc=f"held-out @{state.global_step}"), self.fmt)
        model.train(was_training)
        self.trainer._metrics["train"]["heldout/accuracy"].append(mean(float(r["samples"][0]["correct"]) for r in records))


# Per-step curves kept for plots and the report: our name -> TRL's (or rung's) log key.
CURVES = {
    "reward": "reward",  # of the groups trained on
    "reward_generated": "reward_generated",  # of every generated group, dropped ones included
    "accuracy": "rewards/accuracy/mean",
    "accuracy_generated": "rewards_generated/accuracy/mean",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "frac_zero_std_trained": "frac_zero_std_trained",
    "dynamic_sampling_rounds": "dynamic_sampling/rounds",
    "dropped_share": "dynamic_sampling/dropped_share",
    "extra_generations": "dynamic_sampling/extra_generations",
    "kl": "kl",
    "entropy": "entropy",
    "completion_length": "completions/mean_length",
    "clipped_ratio": "completions/clipped_ratio",
    "heldout_accuracy": "heldout/accuracy",  # only at the steps of eval_every
}

# rung's own per-step state, kept under its log keys.
TRACKED_PREFIXES = ("curriculum/", "accuracy_by_bucket/")


def select(rows: list[dict[str, Any]], stage: RLStageParams, key: str = "rl.stages.main") -> list[dict[str, Any]]:
    """The stage's training prompts: all filtered rows, or those of its difficulty buckets."""
    chosen = rows if stage.buckets is None else [r for r in rows if r.get("bucket") in stage.buckets]
    if len(chosen) < stage.prompts_per_step:
        raise InputError(f"{key}.buckets: {len(chosen)} prompts in {stage.buckets}, fewer than prompts_per_step={stage.prompts_per_step}")
    return chosen


def trainer_for(job: RLJob, callbacks: list[Any] | None = None) -> GRPO | RLOO:
    """The stage's trainer, ready to fit: model, rewards, TRL config, curriculum, held-out callback."""
    compat.check()
    stage, model_dir = job.params, job.init
    rows = select(files.read_jsonl(job.data), stage, job.key)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=placement.resolve(job.device, job.dtype)[1])
    funcs, weights = rewards.build(stage, job.format, f"{job.key}.rewards")
    cls = RLOO if stage.algorithm == "rloo" else GRPO
    trainer = cls(model=model, reward_funcs=funcs, args=trl_config(stage, weights, job.seed, job.work_dir, job.dtype, job.key, job.device), train_dataset=prompts(rows, job.format),
                  processing_class=tok, callbacks=[*job.trainer_callbacks(), *(callbacks or [])])
    trainer.setup_curriculum(curricula.build(rows, stage.curriculum, buckets=job.buckets, max_steps=stage.max_steps, seed=job.seed), rows, stage.dynamic_sampling)
    if stage.eval_every is not None and job.heldout is not None:
        trainer.add_callback(HeldOut(trainer, files.read_jsonl(job.heldout), job.format, job.heldout_sampling, stage.eval_every,
                                     models.load_tokenizer(model_dir)))
    return trainer


def train(job: RLJob, callbacks: list[Any] | None = None) -> JobResult:
    """Run one RL stage from the job's init model (resuming from checkpoint `job.resume` if given);
    the model lands in work_dir/final and (main process) the per-step curves at `job.curves`."""
    trainer = trainer_for(job, callbacks)
    funcs, tok = trainer.reward_funcs, trainer.processing_class
    fit(trainer, job.resume)
    curves = [
        {"step": h["step"], **{name: float(h[key]) for name, key in CURVES.items() if key in h},
         **{key: float(v) for key, v in h.items() if key.startswith(TRACKED_PREFIXES)}}
        for h in trainer.state.log_history if "reward" in h
    ]
    summary = {"train_loss": train_loss(trainer.state), "steps": float(trainer.state.global_step), "reward_errors": float(sum(f.errors for f in funcs))}
    if curves:
        summary["reward_last"] = curves[-1]["reward"]
        summary["reward_generated_last"] = curves[-1].get("reward_generated", curves[-1]["reward"])
        for key in ("frac_reward_zero_std", "frac_zero_std_trained", "dropped_share"):
            summary[key] = mean(c.get(key, 0.0) for c in curves)
        summary["extra_generations"] = sum(c.get("extra_generations", 0.0) for c in curves)
    finalize(trainer, tok, job.work_dir)
    if trainer.args.should_save:
        files.write_json(job.curves, curves)
    return JobResult(metrics=summary)


if __name__ == "__main__":
    main(RLJob, train)
