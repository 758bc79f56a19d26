"""One reward model (a member of its ensemble) with TRL's RewardTrainer: a sequence-classification model with
one label on the init checkpoint, Bradley-Terry loss -log sigmoid(r(chosen) - r(rejected)) on the pairs. The
pairs are tokenized by rung (rung.rewardmodels.encoding), as every later scorer tokenizes them."""

from __future__ import annotations

from datasets import Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase, set_seed
from trl import RewardConfig, RewardTrainer

from rung import files
from rung.config import FormatParams
from rung.errors import InputError
from rung.rewardmodels.encoding import completion_ids, prompt_ids
from rung.train.harness import common_args, fit_and_save, trainable
from rung.train.jobs import JobResult, RewardModelJob, main


def tokenized(pairs: list[dict[str, str]], tok: PreTrainedTokenizerBase, fmt: FormatParams) -> Dataset:
    """The pairs as TRL's processed columns chosen_ids / rejected_ids."""
    rows = []
    for p in pairs:
        prompt = prompt_ids(tok, p["prompt"], fmt)
        rows.append(
            {
                "chosen_ids": completion_ids(tok, prompt, p["chosen"]),
                "rejected_ids": completion_ids(tok, prompt, p["rejected"]),
            }
        )
    return Dataset.from_list(rows)


def train(job: RewardModelJob) -> JobResult:
    """Train one reward model on the job's pairs; the result lands in work_dir/final."""
    params, pairs = job.params, files.read_jsonl(job.data)
    tok = AutoTokenizer.from_pretrained(job.init)
    tok.pad_token = tok.pad_token or tok.eos_token
    set_seed(job.seed)  # the new score head's initial weights: an ensemble's members differ by their seeds
    model = trainable(job.init, job.cpu_matmul, job.device, AutoModelForSequenceClassification, num_labels=1)
    model.config.pad_token_id = tok.pad_token_id  # the score is read at the last token that is not padding
    config = RewardConfig(
        **common_args(job.seed, job.work_dir, job.dtype, params.save_steps, job.device),
        max_steps=params.max_steps,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=params.per_device_train_batch_size,
        lr_scheduler_type="linear",
        max_length=params.max_length,
        center_rewards_coefficient=params.center_rewards_coefficient,
    )
    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=tokenized(pairs, tok, job.format),
        processing_class=tok,
        callbacks=job.trainer_callbacks(),
    )
    # RewardTrainer tokenizes (and filters by max_length) the Dataset it was given into another Dataset: sized.
    assert isinstance(trainer.train_dataset, Dataset)
    if not len(trainer.train_dataset):
        raise InputError(f"{job.key}.max_length: {params.max_length} tokens is shorter than every one of the pairs")
    trained = fit_and_save(trainer, job, tok)
    return JobResult(
        metrics={
            **trained,
            "pairs": float(len(pairs)),
            "pairs_trained": float(len(trainer.train_dataset)),
        }
    )


if __name__ == "__main__":
    main(RewardModelJob, train)
