"""What rung's TRL trainers (SFT and RL) share: arguments, and resumable scratch directories."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from rung import io


def common_args(seed: int, work_dir: Path, dtype: str, save_steps: int) -> dict[str, Any]:
    """Seeding, logging, checkpointing and device settings for SFTConfig / GRPOConfig / RLOOConfig."""
    return dict(
        output_dir=str(work_dir),
        seed=seed,
        data_seed=seed,
        logging_steps=1,
        report_to=["mlflow"],  # per-step metrics into the stage's active MLflow child run
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=1,  # the latest checkpoint is all a resume needs
        use_cpu=not torch.cuda.is_available(),
        # TRL turns bf16 autocast on by default: ~15x slower on CPU with float32 weights.
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        dataloader_num_workers=0,  # a curriculum must see the state of the step it serves
        gradient_checkpointing=False,
    )


def resume_point(work_dir: Path, fingerprint: dict[str, Any], complete: tuple[str, ...] = ("trainer_state.json",)) -> str | None:
    """The last complete checkpoint in `work_dir` if it was written for the same inputs, else None.

    The fingerprint (params, input md5s) is kept beside the checkpoints; when it changed, the old
    checkpoints belong to another experiment and are removed rather than resumed. A checkpoint is
    complete when it holds every file of `complete` (transformers writes trainer_state.json last),
    so a job killed while writing one resumes from the one before.
    """
    stamp = work_dir / "fingerprint.json"
    # Compare through JSON so tuples, paths and key order do not count as changes.
    if stamp.exists() and io.read_json(stamp) == json.loads(io.dumps(fingerprint)):
        done = [c for c in work_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if all((c / f).is_file() for f in complete)]
        return str(max(done, key=lambda c: int(c.name.rsplit("-", 1)[1]))) if done else None
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    io.write_json(stamp, fingerprint)
    return None


FINAL = "final"
CURRICULUM_STATE = "curriculum.json"  # beside TRL's files in each RL checkpoint


def finalize(trainer: Any, tok: Any, work_dir: Path) -> Path:
    """Write the trained model to `work_dir`/final as a plain HF directory; LoRA adapters are
    merged into the weights first. Every process calls it (FSDP / ZeRO-3 gather collectively)."""
    out = work_dir / FINAL
    model = trainer.model
    if hasattr(model, "merge_and_unload"):  # a peft model
        if trainer.args.should_save:
            model.merge_and_unload().save_pretrained(out)
    else:
        trainer.save_model(str(out))
    if trainer.args.should_save:
        tok.save_pretrained(out)
    trainer.accelerator.wait_for_everyone()
    return out
