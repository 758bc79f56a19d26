"""A process reward model: a token-classification model with one output on the init checkpoint, trained on
transformers' Trainer with a binary cross-entropy on each step's last token against its Monte-Carlo label
(soft or hard). TRL 1.16 has no PRMTrainer (it was removed), hence the plain Trainer. Its directory is a
standard transformers token-classification checkpoint plus `process_reward_model.json` (the splitter and the
format), which `load` reads so that a later stage splits and scores solutions as training did."""

from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset
from transformers import (
    AutoModelForTokenClassification,
    AutoTokenizer,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    set_seed,
)

from rung import files
from rung.config import FormatParams
from rung.errors import InputError
from rung.rewardmodels.encoding import prompt_ids, step_ids
from rung.rewardmodels.scoring import SETTINGS
from rung.train.checkpoints import FINAL
from rung.train.harness import common_args, fit_and_save, trainable
from rung.train.jobs import JobResult, ProcessRewardModelJob, main

IGNORE = -100.0  # the label of a token that is no step's last


def examples(rows: list[dict[str, Any]], tok: PreTrainedTokenizerBase, fmt: FormatParams, max_length: int) -> Dataset:
    """Each labelled solution as input ids and a label at each step's last token (IGNORE elsewhere); a
    solution longer than `max_length` tokens is left out."""
    out = []
    for row in rows:
        ids, ends = step_ids(tok, prompt_ids(tok, row["prompt"], fmt), row["steps"])
        if len(ids) > max_length:
            continue
        labels = [IGNORE] * len(ids)
        for end, y in zip(ends, row["labels"], strict=True):
            labels[end] = y
        out.append({"input_ids": ids, "labels": labels})
    return Dataset.from_list(out)


def collate(pad_id: int) -> Any:
    """Right-pad a batch of examples (ids with `pad_id`, labels with IGNORE)."""

    def batch(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)
        pad = [width - len(f["input_ids"]) for f in features]
        return {
            "input_ids": torch.tensor([f["input_ids"] + [pad_id] * p for f, p in zip(features, pad, strict=True)]),
            "attention_mask": torch.tensor(
                [[1] * len(f["input_ids"]) + [0] * p for f, p in zip(features, pad, strict=True)]
            ),
            "labels": torch.tensor([f["labels"] + [IGNORE] * p for f, p in zip(features, pad, strict=True)]),
        }

    return batch


def step_loss(outputs: Any, labels: torch.Tensor, num_items_in_batch: Any = None) -> torch.Tensor:
    """Binary cross-entropy of each step's score (a logit) against its label in [0, 1], mean over the steps."""
    logits = outputs.logits[..., 0]
    scored = labels != IGNORE
    return torch.nn.functional.binary_cross_entropy_with_logits(logits[scored], labels[scored].to(logits.dtype))


def train(job: ProcessRewardModelJob) -> JobResult:
    """Train the PRM on the job's step labels; the result lands in work_dir/final with its settings file."""
    params, rows = job.params, files.read_jsonl(job.data)
    tok = AutoTokenizer.from_pretrained(job.init)
    tok.pad_token = tok.pad_token or tok.eos_token
    set_seed(job.seed)  # the new head's initial weights
    model = trainable(job.init, job.cpu_matmul, job.device, AutoModelForTokenClassification, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id
    data = examples(rows, tok, job.format, params.max_length)
    if not len(data):
        raise InputError(f"{job.key}.max_length: {params.max_length} tokens is shorter than every labelled solution")
    args = TrainingArguments(
        **common_args(job.seed, job.work_dir, job.dtype, params.save_steps, job.device),
        max_steps=params.max_steps,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=params.per_device_train_batch_size,
        lr_scheduler_type="linear",
        remove_unused_columns=False,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=data,
        data_collator=collate(tok.pad_token_id),
        compute_loss_func=step_loss,
        callbacks=job.trainer_callbacks(),
    )
    trained = fit_and_save(trainer, job, tok)
    if trainer.args.should_save:
        files.write_json(
            job.work_dir / FINAL / SETTINGS, {"splitter": params.splitter, "format": job.format.model_dump()}
        )
    return JobResult(
        metrics={
            **trained,
            "solutions": float(len(rows)),
            "solutions_trained": float(len(data)),
        }
    )


if __name__ == "__main__":
    main(ProcessRewardModelJob, train)
