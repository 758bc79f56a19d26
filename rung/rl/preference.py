"""RL stages of preference optimization (algorithms dpo, kto, online_dpo; docs/preference.md): TRL's DPOTrainer and
KTOTrainer on the stage's pairs (rung.rl.pairs), OnlineDPOTrainer with the stage's reward functions (the verifier)
as its judge. The reference model is the init (TRL copies it, or switches a LoRA stage's adapters off). None of
them needs a private override of TRL: their per-step metrics are TRL's `_metrics`
(rung.train.trl_private.train_metrics), their resume transformers' own checkpoints."""

from __future__ import annotations

import os
from typing import Any

from datasets import Dataset
from transformers import AutoTokenizer
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer
from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

from rung import compat, files
from rung.answers import formats
from rung.answers.rows import dataset_row, read_rows
from rung.config import FormatParams, PreferenceParams
from rung.rl import rewards
from rung.train.harness import common_args, finalize, fit, peft_config, train_loss, trainable
from rung.train.jobs import JobResult, RLJob

# Per-step curves: our name -> TRL's log keys, the first logged wins (the same names as GRPO's curves where the
# quantity is the same).
CURVES = {
    "loss": ("loss",),
    "reward_accuracy": ("rewards/accuracies",),  # share of pairs whose implicit reward ranks chosen first
    "margin": ("rewards/margins",),
    "reward_chosen": ("rewards/chosen",),
    "reward_rejected": ("rewards/rejected",),
    "logps_chosen": ("logps/chosen",),
    "logps_rejected": ("logps/rejected",),
    "kl": ("kl", "objective/kl"),  # KTO's batch estimate; online DPO's of its samples
    "reward": ("objective/scores",),  # online DPO: the judge's (the rewards') mean score of its samples
    "entropy": ("objective/entropy",),
}


def curve_point(log: dict[str, Any]) -> dict[str, float]:
    """One step's curves from TRL's log of it."""
    found = {name: next((log[k] for k in keys if k in log), None) for name, keys in CURVES.items()}
    return {"step": log["step"], **{name: float(v) for name, v in found.items() if v is not None}}


def _completion(text: str, prompt: Any) -> Any:
    # TRL reads a conversational example's completions as messages, a plain one's as text
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text


def pair_dataset(pairs: list[dict[str, Any]], fmt: FormatParams) -> Dataset:
    """DPO's examples: the prompt put as the stage's format puts it, the chosen and rejected completions."""
    rows = []
    for p in pairs:
        prompt = formats.prompt(p["prompt"], fmt)
        rows.append(
            {
                "prompt": prompt,
                "chosen": _completion(p["chosen"], prompt),
                "rejected": _completion(p["rejected"], prompt),
            }
        )
    return Dataset.from_list(rows)


def unpaired_dataset(pairs: list[dict[str, Any]], fmt: FormatParams) -> Dataset:
    """KTO's examples: each distinct chosen completion of a prompt desirable, each distinct rejected one not."""
    seen: dict[tuple[str, str], bool] = {}
    for p in pairs:
        seen.setdefault((p["prompt"], p["chosen"]), True)
        seen.setdefault((p["prompt"], p["rejected"]), False)
    rows = []
    for (text, completion), label in seen.items():
        prompt = formats.prompt(text, fmt)
        rows.append({"prompt": prompt, "completion": _completion(completion, prompt), "label": label})
    return Dataset.from_list(rows)


def trl_config(job: RLJob) -> DPOConfig | KTOConfig | OnlineDPOConfig:
    """The TRL config of a preference stage from its params."""
    stage = job.params
    pref = stage.preference or PreferenceParams()
    common = {
        **common_args(job.seed, job.work_dir, job.dtype, stage.save_steps, job.device),
        "max_steps": stage.max_steps,
        "learning_rate": stage.learning_rate,
        "per_device_train_batch_size": pref.batch_size // int(os.environ.get("WORLD_SIZE", "1")),
        "lr_scheduler_type": "constant",
        "max_length": pref.max_length,
    }
    if stage.algorithm == "dpo":
        losses = [pref.loss_type or "sigmoid", *(["sft"] if pref.rpo_alpha else [])]
        weights = [1.0, pref.rpo_alpha] if pref.rpo_alpha else None
        return DPOConfig(**common, beta=pref.beta, loss_type=losses, loss_weights=weights, **stage.trl)
    if stage.algorithm == "kto":
        return KTOConfig(**common, beta=pref.beta, loss_type=pref.loss_type or "kto", **stage.trl)
    return OnlineDPOConfig(
        **common,
        beta=[pref.beta],
        loss_type=pref.loss_type or "sigmoid",
        max_new_tokens=stage.max_completion_length,
        temperature=stage.temperature,
        top_p=stage.top_p,
        reward_weights=[spec.weight for spec in stage.rewards.values()],
        **stage.trl,
    )


def trainer_for(job: RLJob, callbacks: list[Any] | None = None) -> DPOTrainer | KTOTrainer | OnlineDPOTrainer:
    """The stage's TRL trainer, ready to fit, on its pairs (dpo, kto) or its prompts (online_dpo)."""
    compat.check()
    stage = job.params
    tok = AutoTokenizer.from_pretrained(job.init)
    tok.pad_token = tok.pad_token or tok.eos_token
    common: dict[str, Any] = {
        "model": trainable(job.init, job.cpu_matmul, job.device),
        "args": trl_config(job),
        "processing_class": tok,
        "peft_config": peft_config(stage.lora),
        "callbacks": [*job.trainer_callbacks(), *(callbacks or [])],
    }
    if stage.algorithm == "online_dpo":
        funcs, _ = rewards.build(stage, job.format, f"{job.key}.rewards")
        rows = Dataset.from_list([dict(dataset_row(r, job.format)) for r in read_rows(job.data)])
        return OnlineDPOTrainer(reward_funcs=list(funcs), train_dataset=rows, **common)
    pairs = files.read_jsonl(job.data)
    if stage.algorithm == "kto":
        return KTOTrainer(train_dataset=unpaired_dataset(pairs, job.format), **common)
    return DPOTrainer(train_dataset=pair_dataset(pairs, job.format), **common)


def train(job: RLJob, callbacks: list[Any] | None = None) -> JobResult:
    """Run one preference stage (resuming from `job.resume`); the model lands in work_dir/final and (main
    process) the per-step curves at `job.curves`."""
    trainer = trainer_for(job, callbacks)
    fit(trainer, job.resume, job.outage_wait)
    curves = [curve_point(h) for h in trainer.state.log_history if "loss" in h and "step" in h]
    summary = {"train_loss": train_loss(trainer.state), "steps": float(trainer.state.global_step)}
    if curves:
        summary.update({f"{name}_last": v for name, v in curves[-1].items() if name not in ("step", "loss")})
    summary.update(finalize(trainer, trainer.processing_class, job.work_dir, job.init))
    if trainer.args.should_save:
        files.write_json(job.curves, curves)
    return JobResult(metrics=summary)
