"""The SFT stage's schema: the warm-start on the traces, with optional LoRA."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, model_validator

from rung.config.base import Section, deprecated
from rung.config.common import LaunchParams, LoraParams
from rung.config.data import SolutionTraces, TraceSource


def _solution_traces() -> list[TraceSource]:
    return [SolutionTraces()]


class SFTParams(Section):
    enabled: bool = True
    """False skips the warm-start (zero-RL): the sft checkpoint is the base model, unchanged."""
    traces: list[TraceSource] = Field(default_factory=_solution_traces, min_length=1)
    """Where SFT targets come from; several are concatenated (a mix)."""
    max_steps: int | None = Field(40, gt=0)
    """Optimizer steps; null to train for `epochs` instead."""
    epochs: float | None = Field(None, gt=0)
    """Train for this many epochs instead of max_steps (set max_steps to null)."""
    learning_rate: float = Field(5e-5, gt=0)
    """Peak learning rate of AdamW (after the warm-up, then cosine decay)."""
    per_device_train_batch_size: int = Field(8, gt=0)
    """Examples per process per forward pass."""
    gradient_accumulation_steps: int = Field(1, gt=0)
    """Forward passes per optimizer step; the global batch is batch size x this x launch.num_processes."""
    max_length: int = Field(256, gt=0)
    """Token cap of prompt + target."""
    warmup_ratio: float = Field(0.1, ge=0, lt=1)
    """Share of the training steps over which the learning rate rises linearly from 0 (a cosine decay
    follows). Passed as TRL's `warmup_steps`: transformers 5 has no warmup_ratio and reads a float in
    [0, 1) as this ratio (TrainingArguments.get_warmup_steps: ceil(ratio * total steps))."""
    packing: bool = False
    """Pack several examples per sequence (TRL best-fit packing); saves padding on long targets."""
    lora: LoraParams | None = None
    """null: full fine-tuning; a mapping trains LoRA adapters instead."""
    save_steps: int = Field(10, gt=0)
    """Checkpoint interval; rerunning an interrupted stage resumes from the last checkpoint."""
    launch: LaunchParams = LaunchParams()
    """Processes and engine of the training job (one process by default)."""

    @model_validator(mode="before")
    @classmethod
    def _deprecated(cls, data: Any, info: ValidationInfo) -> Any:
        # eval_every was never read here (a copy of the RL stage's); files that set it still validate.
        return deprecated(data, "eval_every", None, info, label="sft")

    @model_validator(mode="after")
    def _length(self) -> SFTParams:
        if (self.max_steps is None) == (self.epochs is None):
            raise ValueError("max_steps: set exactly one of max_steps and epochs")
        return self
