"""RL stages of preference optimization (algorithms dpo, kto, online_dpo; docs/preference.md): TRL's DPOTrainer and
KTOTrainer on the stage's pairs (rung.rl.pairs), OnlineDPOTrainer with the stage's reward functions (the verifier)
as its judge. The reference model is the init (TRL copies it, or switches a LoRA stage's adapters off). rung
tokenizes the pairs itself (`example_ids`: a model wrote the completions, so their text is plain text) and hands
TRL the ids (rung.train.trl_private.PretokenizedDPO / PretokenizedKTO); online DPO trains on the ids it generates.
Their per-step metrics are TRL's `_metrics` (rung.train.trl_private.train_metrics), their resume transformers'
own checkpoints."""

from __future__ import annotations

import os
from typing import Any

from datasets import Dataset
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from trl import DPOConfig, KTOConfig
from trl.data_utils import common_prefix_length
from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

from rung import compat, files
from rung.answers import formats
from rung.answers.formats import Prompt
from rung.answers.rows import dataset_row, read_rows
from rung.config import FormatParams, PreferenceParams
from rung.envs import template
from rung.generate.completion import encode
from rung.rewardmodels.encoding import text_ids
from rung.rl import rewards
from rung.train.harness import common_args, finalize, fit, peft_config, train_loss, trainable
from rung.train.jobs import JobResult, RLJob
from rung.train.trl_private import PretokenizedDPO, PretokenizedKTO

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


def example_ids(tok: PreTrainedTokenizerBase, prompt: Prompt, completion: str) -> tuple[list[int], list[int]]:
    """A (prompt, completion)'s prompt and completion ids as TRL's DPO and KTO trainers tokenize them (identical on
    ordinary text), except that the completion's text is tokenized as text: a completion that spells `<|im_end|>`
    gets the ids of its characters, never the token that would end its turn. A conversation's completion ends as
    the chat template ends the assistant's turn, a plain prompt's on EOS (TRL adds it)."""
    prompt_ids = encode(tok, [prompt])[0]
    if isinstance(prompt, str):
        return prompt_ids, [*text_ids(tok, completion), tok.eos_token_id]
    whole = template.render_ids(tok, [*prompt, {"role": "assistant", "content": completion}])
    n = common_prefix_length(prompt_ids, whole)  # where TRL starts the completion too (a template may differ)
    return prompt_ids[:n], whole[n:]


CHOICES = ("chosen", "rejected")


def pair_dataset(pairs: list[dict[str, Any]], fmt: FormatParams, tok: PreTrainedTokenizerBase) -> Dataset:
    """DPO's examples, tokenized: the prompt put as the stage's format puts it, the chosen and rejected completions."""
    rows = []
    for p in pairs:
        prompt = formats.prompt(p["prompt"], fmt)
        (chosen_prompt, chosen), (rejected_prompt, rejected) = (example_ids(tok, prompt, p[k]) for k in CHOICES)
        n = min(len(chosen_prompt), len(rejected_prompt))  # both completions start after the prompt they share
        chosen, rejected = [*chosen_prompt[n:], *chosen], [*rejected_prompt[n:], *rejected]
        rows.append({"prompt_ids": chosen_prompt[:n], "chosen_ids": chosen, "rejected_ids": rejected})
    return Dataset.from_list(rows)


def unpaired_dataset(pairs: list[dict[str, Any]], fmt: FormatParams, tok: PreTrainedTokenizerBase) -> Dataset:
    """KTO's examples, tokenized: each distinct chosen completion of a prompt desirable, each distinct rejected one
    not."""
    seen: dict[tuple[str, str], bool] = {}
    for p in pairs:
        seen.setdefault((p["prompt"], p["chosen"]), True)
        seen.setdefault((p["prompt"], p["rejected"]), False)
    rows = []
    for (text, completion), label in seen.items():
        prompt_ids, completion_ids = example_ids(tok, formats.prompt(text, fmt), completion)
        rows.append({"prompt_ids": prompt_ids, "completion_ids": completion_ids, "label": label})
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


def trainer_for(job: RLJob, callbacks: list[Any] | None = None) -> PretokenizedDPO | PretokenizedKTO | OnlineDPOTrainer:
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
        return PretokenizedKTO(train_dataset=unpaired_dataset(pairs, job.format, tok), **common)
    return PretokenizedDPO(train_dataset=pair_dataset(pairs, job.format, tok), **common)


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
