"""What rung's TRL trainers (SFT and RL) share around `trainer.train()`: the model in fp32 master
weights, the arguments (bf16 / fp16 compute by autocast), a fit that resumes, the loss over a resumed
run, and the final model directory with how far training moved it."""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from functools import cache
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig
from transformers import AutoModelForCausalLM, PreTrainedModel, TrainerState
from transformers.trainer import TRAINER_STATE_NAME

from rung import onednn, placement
from rung.config import LoraParams
from rung.train import movement, trl_private
from rung.train.checkpoints import FINAL
from rung.train.jobs import TrainJob

_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4  # glibc's mallopt parameters (malloc.h)


def trainable(
    model_dir: Path, cpu_matmul: str = "default", device: str = "auto", auto: Any = AutoModelForCausalLM, **kwargs: Any
) -> PreTrainedModel:
    """The model a training stage updates, in float32 whatever `model.dtype` says: the trainer's
    weights and AdamW state are the master copy (an update of lr 1e-6-5e-5 rounds away in bf16, whose
    spacing near a weight of 0.02 is 1.2e-4), and bf16 / fp16 is the compute dtype, run by autocast
    (single device, DDP) or the engine's mixed-precision policy (FSDP, DeepSpeed): docs/gpu.md.
    `cpu_matmul` is params `model.cpu_matmul`: 'onednn' runs its CPU fp32 linears on oneDNN; `device`
    params `model.device`: training on the CPU keeps the memory it frees (keep_freed_memory). `auto` and
    `kwargs`: the transformers Auto class and its arguments (a reward model's sequence-classification head)."""
    model = auto.from_pretrained(model_dir, dtype=torch.float32, **kwargs)
    if cpu_matmul == "onednn":
        onednn.train_on_onednn(model)  # on a GPU, or in bf16 compute, the layers take nn.Linear's path
    if placement.device(device).type == "cpu":  # a GPU node's host would keep the loaded weights' pages
        keep_freed_memory()
    return model


@cache
def keep_freed_memory() -> bool:
    """Serve large allocations from the heap and never trim it, so that a training step reuses the pages the
    last one freed: glibc maps each allocation over 32 MB (a batch's logits over a 49k vocabulary are
    hundreds of MB) afresh and unmaps it on free, and faulting those pages in again took a third of an RL
    step's system time on the demo. The process keeps its peak memory, as CUDA's caching allocator does.
    glibc's mallopt, which no Python library sets; False elsewhere (musl, macOS). The setting is the
    process's: once."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):  # not glibc
        return False
    return bool(mallopt(_M_MMAP_MAX, 0)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))


def peft_config(lora: LoraParams | None) -> LoraConfig | None:
    """peft's LoraConfig of a stage's `lora` params (SFT and RL), None for full fine-tuning."""
    if lora is None:
        return None
    return LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )


def common_args(seed: int, work_dir: Path, dtype: str, save_steps: int, device: str = "auto") -> dict[str, Any]:
    """Seeding, logging, checkpointing and device settings for SFTConfig / GRPOConfig / RLOOConfig;
    `device` and `dtype` are params `model.device` / `model.dtype` (rung.placement resolves them)."""
    where, dtype = placement.resolve(device, dtype)
    if where.type == "cuda" and "LOCAL_RANK" not in os.environ:
        torch.cuda.set_device(where)  # one process: accelerate places the model on the current device
    return dict(
        output_dir=str(work_dir),
        seed=seed,
        data_seed=seed,
        logging_steps=1,
        report_to="none",  # per-step logs go to the stage's MLflow run through rung.train.run_log (fit)
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=1,  # the latest checkpoint is all a resume needs
        use_cpu=where.type == "cpu",
        # the compute dtype, by autocast over the fp32 weights (TRL's own default, bf16 on, is ~15x
        # slower on the CPU); fp16 adds transformers' loss scaler
        bf16=dtype == "bfloat16",
        fp16=dtype == "float16",
        dataloader_num_workers=0,  # a curriculum must see the state of the step it serves
        gradient_checkpointing=False,
    )


def fit(trainer: Any, resume: str | None, outage_wait: float = 300.0) -> None:
    """trainer.train(), resumed from checkpoint `resume` if given, with each step's update size
    logged (rung.train.movement; TRL's trainers) and every log sent to the stage's MLflow run (rung.train.run_log,
    which waits up to `outage_wait` seconds at the end for a server that went away). A checkpoint of the
    last step (a job killed while saving or publishing its model, or failed for want of MLflow) is
    loaded rather than trained from: transformers would train one step past max_steps."""
    if trl_private.has_train_metrics(trainer):  # logged through them; a plain Trainer logs its loss alone
        trainer.add_callback(movement.UpdateSize(trainer))
    log = None
    if trainer.is_world_process_zero() and importlib.util.find_spec("mlflow"):  # a GPU bench env may lack it
        from rung.train.run_log import RunLog

        log = RunLog.of_active_run(outage_wait)
    if log:
        trainer.add_callback(log)
    if resume:
        state = TrainerState.load_from_json(str(Path(resume) / TRAINER_STATE_NAME))
        if state.global_step >= state.max_steps:
            trl_private.load_checkpoint(trainer, resume)
            trainer.state = state
            if log:
                log.add_history(state.log_history)
                log.close(trainer.args.output_dir)
            return
    trainer.train(resume_from_checkpoint=resume)
    if log:
        log.close(trainer.args.output_dir)


def train_loss(state: Any) -> float:
    """Mean loss over every step of a run, the steps before a resume included (TRL's
    TrainOutput.training_loss averages the steps of the last `train` call only)."""
    losses = [h["loss"] for h in state.log_history if "loss" in h]
    return sum(losses) / len(losses) if losses else 0.0


def finalize(trainer: Any, tok: Any, work_dir: Path, init: Path) -> dict[str, float]:
    """Write the trained model to `work_dir`/final as a plain HF directory (fp32, so that progress
    below bf16's resolution survives into the next stage); LoRA adapters are merged into the weights
    first. Every process calls it (FSDP / ZeRO-3 gather collectively). Returns, on the main process,
    how far the weights moved from `init` (rung.train.movement.since)."""
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
    return movement.since(init, out) if trainer.args.should_save else {}


def fit_and_save(trainer: Any, job: TrainJob, tok: Any) -> dict[str, float]:
    """`fit` (resumed from `job.resume`), then `finalize`: the metrics every training stage reports first, how far
    the weights moved, the mean training loss and the steps taken."""
    fit(trainer, job.resume, job.outage_wait)
    moved = finalize(trainer, tok, job.work_dir, job.init)
    return {**moved, "train_loss": train_loss(trainer.state), "steps": float(trainer.state.global_step)}
