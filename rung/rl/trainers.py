"""RL stages with TRL's GRPOTrainer or RLOOTrainer on verifiable rewards: the trainers (rung.train.trl_seam's
GRPOSeam, RLOOSeam) given their parts (a batch source with its reward log, the objective's advantages, a metrics
sink, the rollout engine and log-probs of rung.rl.rollouts), their arguments from params, the held-out accuracy
callback, and the job entry point (`python -m rung.rl.trainers`)."""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from functools import partial
from pathlib import Path
from statistics import mean
from typing import Any

import torch
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, RLOOConfig

from rung import compat, envs, files, models, placement
from rung.answers import formats
from rung.answers.rows import Row, dataset_row, read_rows
from rung.config import FormatParams, RLStageParams, SamplingParams
from rung.config.preference import GRPO_CONFIG_FIELDS, PREFERENCE_ALGORITHMS
from rung.envs.loop import budget
from rung.errors import InputError
from rung.eval.evaluate import grade
from rung.generate.api import generate
from rung.generate.completion import encode
from rung.rl import curricula, episodes, gold, kl_probe, preference, rewards, vllm_rollouts
from rung.rl.advantages import Advantages
from rung.rl.reward_logs import RewardLog
from rung.rl.rollouts import generation
from rung.rl.sampling import BatchSource
from rung.train.harness import common_args, finalize, fit, peft_config, train_loss, trainable
from rung.train.jobs import JobResult, RLJob, main
from rung.train.trl_private import train_metrics
from rung.train.trl_seam import GRPOSeam, RLOOSeam


def prompts(rows: list[Row], fmt: FormatParams) -> Dataset:
    """Conversational prompts plus the columns the reward functions read (rung.answers.rows.dataset_row)."""
    return Dataset.from_list([dict(dataset_row(r, fmt)) for r in rows])


# rung's stage fields that are TRL config fields under the same name.
_PASSTHROUGH = ("max_steps", "learning_rate", "max_completion_length", "temperature", "top_p", *GRPO_CONFIG_FIELDS)


def trl_config(
    stage: RLStageParams,
    weights: list[float],
    seed: int,
    work_dir: Path,
    dtype: str = "float32",
    key: str = "rl.stages.main",
    device: str = "auto",
    max_turns: int = 1,
) -> GRPOConfig | RLOOConfig:
    """TRL's GRPOConfig (or RLOOConfig) from a stage's params; TRL's own names pass straight through, but
    max_completion_length, which is per assistant turn: an episode of `max_turns` turns may hold that many times
    it (rung.rl.episodes)."""
    cls = RLOOConfig if stage.algorithm == "rloo" else GRPOConfig
    fields = {f.name for f in dataclasses.fields(cls)}
    explicit = stage.model_fields_set
    unsupported = sorted(k for k in _PASSTHROUGH if k not in fields and k in explicit)
    if unsupported:
        raise InputError(f"{key}: {unsupported} are not settings of TRL's {cls.__name__} (algorithm {stage.algorithm})")
    unknown = sorted(set(stage.trl) - fields)
    if unknown:
        raise InputError(f"{key}.trl: {unknown} are not fields of TRL's {cls.__name__}")
    if stage.trl.get("use_transformers_continuous_batching") and placement.resolve(device, dtype)[1] != "float32":
        # TRL 1.16 casts the trained model itself to bf16 / fp16 before each such generation
        raise InputError(
            f"{key}.trl.use_transformers_continuous_batching: TRL casts the trained weights to the compute dtype "
            "for it, which drops their updates; use model.dtype: float32 or rung's rollouts"
        )
    passed = {k: getattr(stage, k) for k in _PASSTHROUGH if k in fields}
    passed["max_completion_length"] = budget(stage.max_completion_length, max_turns)
    return cls(
        **common_args(seed, work_dir, dtype, stage.save_steps, device),
        **passed,
        # prompts_per_step counts over all processes (torchrun and accelerate set WORLD_SIZE)
        per_device_train_batch_size=stage.prompts_per_step
        // int(os.environ.get("WORLD_SIZE", "1"))
        * stage.num_generations,
        reward_weights=weights,
        lr_scheduler_type="constant",
        **stage.trl,
    )


GRPO = GRPOSeam
RLOO = RLOOSeam


class HeldOut(TrainerCallback):
    """Greedy accuracy of the policy on the held-out split every `every` steps and at the last one,
    logged with that step's metrics as `heldout/accuracy`: a learning curve on data the stage never
    trains on, graded as the eval stage grades (rung.eval.evaluate). Every process generates the same
    greedy completions (so sharded models work); the main process logs them."""

    def __init__(
        self,
        trainer: Any,
        rows: list[Row],
        fmt: FormatParams,
        sampling: SamplingParams,
        every: int,
        tok: Any,
    ):
        self.trainer, self.rows, self.fmt, self.sampling, self.every, self.tok = (
            trainer,
            rows,
            fmt,
            sampling,
            every,
            tok,
        )
        self.prompts = encode(tok, [formats.prompt(r["prompt"], fmt) for r in rows])  # the ids it trains on

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        if state.global_step % self.every and state.global_step != state.max_steps:
            return
        was_training = model.training
        model.eval()
        with torch.no_grad():
            records = grade(
                self.rows,
                generate(
                    self.trainer.rollouts.model(model),
                    self.tok,
                    self.prompts,
                    self.sampling,
                    desc=f"held-out @{state.global_step}",
                ),
                self.fmt,
            )
        model.train(was_training)
        train_metrics(self.trainer)["heldout/accuracy"].append(mean(float(r["samples"][0]["correct"]) for r in records))


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

# rung's own per-step state, kept under its log keys (episodes/: only a stage with an environment logs them).
TRACKED_PREFIXES = ("curriculum/", "accuracy_by_bucket/", episodes.PREFIX, gold.PREFIX)


def select(rows: list[Row], stage: RLStageParams, key: str = "rl.stages.main") -> list[Row]:
    """The stage's training prompts: all filtered rows, or those of its difficulty buckets."""
    chosen = rows if stage.buckets is None else [r for r in rows if r.get("bucket") in stage.buckets]
    if len(chosen) < stage.prompts_per_step:
        raise InputError(
            f"{key}.buckets: {len(chosen)} prompts in {stage.buckets}, "
            f"fewer than prompts_per_step={stage.prompts_per_step}"
        )
    return chosen


def trainer_for(job: RLJob, callbacks: list[Any] | None = None) -> GRPO | RLOO:
    """The stage's trainer, ready to fit: model, rewards, TRL config, curriculum, held-out callback."""
    compat.check()
    stage, model_dir = job.params, job.init
    if stage.use_vllm:
        vllm_rollouts.preflight(stage, model_dir, job.key)
    rows = select(read_rows(job.data), stage, job.key)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = trainable(model_dir, job.cpu_matmul, job.device)
    dataset = prompts(rows, job.format)
    max_turns = 1
    episodic: dict[str, Any] = {}  # GRPOTrainer's rollout_func, for episodes
    if job.environment is None:
        funcs, weights = rewards.build(stage, job.format, f"{job.key}.rewards")
    else:  # episodes: rung's loop is the rollout, the rewards score episodes (rung.rl.episodes)
        key = f"{job.key}.environment" if stage.environment else "environment"
        environment = envs.check(job.environment, tok, key)
        funcs, weights = episodes.rewards(stage, job.format, environment, f"{job.key}.rewards")
        max_turns = environment.spec.max_turns
        episodic = {"rollout_func": episodes.rollouts(environment, job.format, dataset.to_list(), stage, job.key)}
    cls = RLOO if stage.algorithm == "rloo" else GRPO
    metrics: defaultdict[str, list[float]] = defaultdict(list)  # the step's, which TRL logs (rung.train.trl_private)
    log = RewardLog(
        [f.__name__ for f in funcs],
        torch.tensor(weights, dtype=torch.float32),
        [r.get("bucket", "unknown") for r in rows],
        metrics,
    )
    args = trl_config(stage, weights, job.seed, job.work_dir, job.dtype, job.key, job.device, max_turns)
    batch_source = BatchSource(
        curricula.build(rows, stage.curriculum, buckets=job.buckets, max_steps=stage.max_steps, seed=job.seed),
        dataset,
        stage.dynamic_sampling,
        stage.num_generations,
        args.world_size,
        args.process_index,
        funcs,
        log,
    )
    trainer = cls(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tok,
        peft_config=peft_config(stage.lora),
        callbacks=[*job.trainer_callbacks(), *(callbacks or [])],
        batch_source=batch_source,
        advantages=Advantages.of(stage, job.key),
        metrics=metrics,
        generation=partial(generation, key=job.key, init=kl_probe.init_copy(model, stage)),
        **episodic,
    )
    if stage.eval_every is not None and job.heldout is not None:
        assert job.heldout_sampling is not None  # the stage sets both (rung.train.jobs.RLJob)
        trainer.add_callback(
            HeldOut(
                trainer,
                read_rows(job.heldout),
                job.format,
                job.heldout_sampling,
                stage.eval_every,
                models.load_tokenizer(model_dir),
            )
        )
    return trainer


def train(job: RLJob, callbacks: list[Any] | None = None) -> JobResult:
    """Run one RL stage from the job's init model (resuming from checkpoint `job.resume` if given);
    the model lands in work_dir/final and (main process) the per-step curves at `job.curves`."""
    if job.params.algorithm in PREFERENCE_ALGORITHMS:  # DPO, KTO, online DPO: TRL's trainers as they are
        return preference.train(job, callbacks)
    trainer = trainer_for(job, callbacks)
    funcs, tok = trainer.reward_funcs, trainer.processing_class
    fit(trainer, job.resume, job.outage_wait)
    curves = [
        {
            "step": h["step"],
            **{name: float(h[key]) for name, key in CURVES.items() if key in h},
            **{key: float(v) for key, v in h.items() if key.startswith(TRACKED_PREFIXES)},
        }
        for h in trainer.state.log_history
        if "reward" in h
    ]
    summary = {
        "train_loss": train_loss(trainer.state),
        "steps": float(trainer.state.global_step),
        **rewards.error_counts([f for f in funcs if isinstance(f, rewards.Guarded)]),
    }
    if curves:
        summary["reward_last"] = curves[-1]["reward"]
        summary["reward_generated_last"] = curves[-1].get("reward_generated", curves[-1]["reward"])
        for key in ("frac_reward_zero_std", "frac_zero_std_trained", "dropped_share"):
            summary[key] = mean(c.get(key, 0.0) for c in curves)
        summary["extra_generations"] = sum(c.get("extra_generations", 0.0) for c in curves)
    if job.environment is not None:
        summary.update(episodes.summary(curves))
    summary.update(gold.summary(curves))
    summary.update(finalize(trainer, tok, job.work_dir, job.init))
    if trainer.args.should_save:
        files.write_json(job.curves, curves)
    return JobResult(metrics=summary)


if __name__ == "__main__":
    main(RLJob, train)
