"""RL stages with TRL's GRPOTrainer on verifiable rewards."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rung import answer_format, io, rewards
from rung.config import FormatParams, RLStageParams
from rung.trainer import common_args


def prompts(rows: list[dict[str, Any]], fmt: FormatParams) -> Dataset:
    """Conversational prompts plus the columns the reward functions read."""
    return Dataset.from_list(
        [
            {
                "prompt": answer_format.messages(r["prompt"], fmt),
                "prompt_text": r["prompt"],
                "answer": r["answer"],
                "task": r["task"],
                "meta": io.dumps(r["meta"]),
            }
            for r in rows
        ]
    )


def grpo_config(stage: RLStageParams, seed: int, work_dir: Path, dtype: str = "float32") -> GRPOConfig:
    """TRL's GRPOConfig from a stage's params (TRL's own names pass straight through)."""
    return GRPOConfig(
        **common_args(seed, work_dir, dtype),
        max_steps=stage.max_steps,
        learning_rate=stage.learning_rate,
        per_device_train_batch_size=stage.prompts_per_step * stage.num_generations,
        num_generations=stage.num_generations,
        max_completion_length=stage.max_completion_length,
        temperature=stage.temperature,
        top_p=stage.top_p,
        beta=stage.beta,
        loss_type=stage.loss_type,
        epsilon=stage.epsilon,
        epsilon_high=stage.epsilon_high,
        scale_rewards=stage.scale_rewards,
        reward_weights=list(stage.rewards.values()),
        lr_scheduler_type="constant",
    )


# Per-step curves kept for plots and the report: our name -> TRL's log key.
CURVES = {
    "reward": "reward",
    "accuracy": "rewards/accuracy/mean",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "kl": "kl",
    "entropy": "entropy",
    "completion_length": "completions/mean_length",
    "clipped_ratio": "completions/clipped_ratio",
}


def train(model_dir: Path, rows: list[dict[str, Any]], fmt: FormatParams, stage: RLStageParams, seed: int, work_dir: Path, dtype: str = "float32") -> tuple[Any, Any, dict[str, float], list[dict[str, float]]]:
    """Run one GRPO stage from `model_dir`; returns (model, tokenizer, summary metrics, per-step curves)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    funcs = rewards.build(stage.rewards, fmt)
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=grpo_config(stage, seed, work_dir, dtype), train_dataset=prompts(rows, fmt), processing_class=tok)
    result = trainer.train()
    curves = [
        {"step": h["step"], **{name: float(h[key]) for name, key in CURVES.items() if key in h}}
        for h in trainer.state.log_history if "reward" in h
    ]
    summary = {"train_loss": float(result.training_loss), "steps": float(result.global_step)}
    if curves:
        summary["reward_last"] = curves[-1]["reward"]
        summary["frac_reward_zero_std"] = sum(c.get("frac_reward_zero_std", 0.0) for c in curves) / len(curves)
    return trainer.model, tok, summary, curves
