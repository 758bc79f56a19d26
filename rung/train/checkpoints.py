"""What rung's TRL trainers (SFT and RL) share: arguments, and resumable scratch directories."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from rung import files

FINGERPRINT = "fingerprint.json"  # the inputs the checkpoints were written for
FINAL = "final"
CURRICULUM_STATE = "curriculum.json"  # beside TRL's files in each RL checkpoint


def common_args(seed: int, work_dir: Path, dtype: str, save_steps: int, device: str = "auto") -> dict[str, Any]:
    """Seeding, logging, checkpointing and device settings for SFTConfig / GRPOConfig / RLOOConfig;
    `device` and `dtype` are params `model.device` / `model.dtype` (rung.placement resolves them)."""
    import importlib.util

    import torch  # here and below, not at the top: rung.train.launch (and so preflight) uses the scratch-directory helpers only

    from rung import placement

    where, dtype = placement.resolve(device, dtype)
    if where.type == "cuda" and "LOCAL_RANK" not in os.environ:
        torch.cuda.set_device(where)  # one process: accelerate places the model on the current device
    return dict(
        output_dir=str(work_dir),
        seed=seed,
        data_seed=seed,
        logging_steps=1,
        # per-step metrics into the stage's active MLflow child run (a GPU bench environment may lack mlflow)
        report_to=["mlflow"] if importlib.util.find_spec("mlflow") else [],
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=1,  # the latest checkpoint is all a resume needs
        use_cpu=where.type == "cpu",
        # TRL turns bf16 autocast on by default: ~15x slower on CPU with float32 weights.
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        dataloader_num_workers=0,  # a curriculum must see the state of the step it serves
        gradient_checkpointing=False,
    )


def complete_checkpoints(work_dir: Path, complete: tuple[str, ...] = ("trainer_state.json",)) -> list[Path]:
    """The checkpoints in `work_dir` that hold every file of `complete`, oldest first.

    transformers writes trainer_state.json last, so a checkpoint whose writer was killed is left
    out; one killed while writing trainer_state.json itself leaves a file that does not parse.
    """
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    def done(c: Path) -> bool:
        if not all((c / f).is_file() for f in complete):
            return False
        try:
            json.loads((c / "trainer_state.json").read_text())
        except (OSError, ValueError):
            return False
        return True

    found = [c for c in work_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if done(c)]
    return sorted(found, key=lambda c: int(c.name.rsplit("-", 1)[1]))


def resume_point(work_dir: Path, fingerprint: dict[str, Any], complete: tuple[str, ...] = ("trainer_state.json",)) -> str | None:
    """The last complete checkpoint in `work_dir` (complete_checkpoints) if it was written for the
    same inputs, else None.

    The fingerprint (params, input md5s) is kept beside the checkpoints; when it changed, the old
    checkpoints belong to another experiment and are removed rather than resumed.
    """
    stamp = work_dir / FINGERPRINT
    # Compare through JSON so tuples, paths and key order do not count as changes.
    if stamp.exists() and files.read_json(stamp) == json.loads(files.dumps(fingerprint)):
        done = complete_checkpoints(work_dir, complete)
        return str(done[-1]) if done else None
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    files.write_json(stamp, fingerprint)
    return None


def discard(work_dir: Path) -> None:
    """Remove a finished job's work directory. The fingerprint goes first: a removal cut short by a
    kill then leaves checkpoints that resume_point clears instead of resuming from half of one."""
    (work_dir / FINGERPRINT).unlink(missing_ok=True)
    shutil.rmtree(work_dir)


def fit(trainer: Any, resume: str | None) -> None:
    """trainer.train(), resumed from checkpoint `resume` if given. A checkpoint of the last step (a
    job killed while saving or publishing its model) is loaded rather than trained from: transformers
    would train one step past max_steps."""
    from transformers import TrainerState
    from transformers.trainer import TRAINER_STATE_NAME

    if resume:
        state = TrainerState.load_from_json(str(Path(resume) / TRAINER_STATE_NAME))
        if state.global_step >= state.max_steps:
            trainer._load_from_checkpoint(resume)
            trainer.state = state
            return
    trainer.train(resume_from_checkpoint=resume)


def train_loss(state: Any) -> float:
    """Mean loss over every step of a run, the steps before a resume included (TRL's
    TrainOutput.training_loss averages the steps of the last `train` call only)."""
    losses = [h["loss"] for h in state.log_history if "loss" in h]
    return sum(losses) / len(losses) if losses else 0.0


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
