"""SFT warm-start with TRL's SFTTrainer: completion-only loss on chat-formatted traces, optional
LoRA (peft) and packing."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from rung import answer_format
from rung.config import FormatParams, SFTParams
from rung.trainer import common_args, finalize


def examples(traces: list[dict[str, Any]], fmt: FormatParams) -> Dataset:
    """Prompt/completion conversations: TRL masks the prompt, so only the response is learned."""
    return Dataset.from_list(
        [{"prompt": answer_format.messages(t["prompt"], fmt), "completion": [{"role": "assistant", "content": t["target"]}]} for t in traces]
    )


class RecordingCollator:
    """Wraps the trainer's collator to note a digest of every example this process trains on
    (written as shards/rank<r>.txt), so a distributed run shows each rank saw its own shard."""

    def __init__(self, inner: Any):
        self.inner, self.seen = inner, []

    def __call__(self, features: list[dict[str, Any]]) -> Any:
        self.seen += [hashlib.md5(str(f["input_ids"]).encode()).hexdigest() for f in features]
        return self.inner(features)


def train(model_dir: Path, traces: list[dict[str, Any]], fmt: FormatParams, params: SFTParams, seed: int, work_dir: Path, dtype: str = "float32", resume: str | None = None) -> dict[str, float]:
    """Fine-tune the model at `model_dir`; the result lands in `work_dir`/final; returns final
    train metrics. Per-step metrics go to the active MLflow run through TRL's MLflowCallback."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    config = SFTConfig(
        **common_args(seed, work_dir, dtype, params.save_steps),
        max_steps=params.max_steps or -1,
        num_train_epochs=params.epochs or 1.0,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=params.per_device_train_batch_size,
        gradient_accumulation_steps=params.gradient_accumulation_steps,
        warmup_steps=params.warmup_ratio,  # transformers 5: a float < 1 is a ratio of the steps
        lr_scheduler_type="cosine",
        max_length=params.max_length,
        completion_only_loss=True,
        packing=params.packing,
    )
    lora = params.lora
    peft_config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules, task_type="CAUSAL_LM") if lora else None
    trainer = SFTTrainer(model=model, args=config, train_dataset=examples(traces, fmt), processing_class=tok, peft_config=peft_config)
    trainer.data_collator = recorder = RecordingCollator(trainer.data_collator)
    result = trainer.train(resume_from_checkpoint=resume)
    shard = work_dir / "shards" / f"rank{trainer.args.process_index}.txt"
    shard.parent.mkdir(parents=True, exist_ok=True)
    shard.write_text("\n".join(recorder.seen) + "\n")
    finalize(trainer, tok, work_dir)
    return {"train_loss": float(result.training_loss), "steps": float(result.global_step), "examples": float(len(traces))}
