"""SFT warm-start with TRL's SFTTrainer: completion-only loss on chat-formatted targets."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from rung import answer_format
from rung.config import FormatParams, SFTParams
from rung.trainer import common_args


def examples(rows: list[dict[str, Any]], fmt: FormatParams) -> Dataset:
    """Prompt/completion conversations: TRL masks the prompt, so only the response is learned."""
    return Dataset.from_list(
        [
            {
                "prompt": answer_format.messages(r["prompt"], fmt),
                "completion": [{"role": "assistant", "content": answer_format.target(r["answer"], r["solution"], fmt)}],
            }
            for r in rows
        ]
    )


def train(model_dir: Path, rows: list[dict[str, Any]], fmt: FormatParams, params: SFTParams, seed: int, work_dir: Path, dtype: str = "float32", resume: str | None = None) -> tuple[Any, Any, dict[str, float]]:
    """Fine-tune the model at `model_dir`; returns (model, tokenizer, final train metrics).

    Per-step metrics go to the active MLflow run through TRL's MLflowCallback.
    """
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    config = SFTConfig(
        **common_args(seed, work_dir, dtype, params.save_steps),
        max_steps=params.max_steps,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=params.per_device_train_batch_size,
        gradient_accumulation_steps=params.gradient_accumulation_steps,
        warmup_steps=params.warmup_ratio,  # transformers 5: a float < 1 is a ratio of max_steps
        lr_scheduler_type="cosine",
        max_length=params.max_length,
        completion_only_loss=True,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=examples(rows, fmt), processing_class=tok)
    result = trainer.train(resume_from_checkpoint=resume)
    return trainer.model, tok, {"train_loss": float(result.training_loss), "steps": float(result.global_step)}
