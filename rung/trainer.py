"""TrainingArguments shared by rung's TRL trainers (SFT and RL)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def common_args(seed: int, work_dir: Path, dtype: str) -> dict[str, Any]:
    """Seeding, logging and device settings for SFTConfig / GRPOConfig."""
    return dict(
        output_dir=str(work_dir),
        seed=seed,
        data_seed=seed,
        logging_steps=1,
        report_to=["mlflow"],  # per-step metrics into the stage's active MLflow child run
        save_strategy="no",
        use_cpu=not torch.cuda.is_available(),
        # TRL turns bf16 autocast on by default: ~15x slower on CPU with float32 weights.
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        dataloader_num_workers=0,  # a curriculum sampler must see fresh state
        gradient_checkpointing=False,
    )
