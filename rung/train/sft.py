"""SFT warm-start with TRL's SFTTrainer: completion-only loss on chat-formatted traces, tokenized by rung with
every text plain (`examples`), optional LoRA (peft) and packing."""

from __future__ import annotations

import copy
import json
from collections.abc import Sized
from typing import Any

from datasets import Dataset
from transformers import AutoTokenizer, PreTrainedTokenizerBase
from trl import SFTConfig
from trl.chat_template_utils import get_training_chat_template, has_generation_markers
from trl.data_utils import common_prefix_length

from rung import files
from rung.answers import formats
from rung.config import FormatParams
from rung.envs import template
from rung.errors import InputError
from rung.train.harness import common_args, fit_and_save, peft_config, trainable
from rung.train.jobs import JobResult, SFTJob, main
from rung.train.prefix import SharedPrefixSFT


def examples(traces: list[dict[str, Any]], fmt: FormatParams, tok: PreTrainedTokenizerBase) -> Dataset:
    """Each trace tokenized as TRL's SFTTrainer tokenizes a prompt/completion pair (the conversation through the
    chat template, a retry trace's `history` ending its prompt and an episode's `messages` and tools' schemas
    its completion; or the plain text and EOS), with the mask of the trained tokens as `assistant_masks` (TRL
    applies that column whatever its config): the response, and with any episode among the traces only what the
    template marks as the assistant's (never a tool's output). Unlike TRL, every text is tokenized as plain text
    (rung.envs.template.render_ids): a target, a tool's output or a wrong answer written by a model that spells
    `<|im_end|>` cannot close its turn."""
    assistant_only = episodes(traces)
    if assistant_only and not has_generation_markers(tok.chat_template):
        tok = copy.deepcopy(tok)  # TRL's own swap: its training template for the model's family marks them
        tok.chat_template = get_training_chat_template(tok)
    return Dataset.from_list([_example(t, fmt, tok, assistant_only) for t in traces])


def _example(
    trace: dict[str, Any], fmt: FormatParams, tok: PreTrainedTokenizerBase, assistant_only: bool
) -> dict[str, list[int]]:
    prompt = _prompt(trace, fmt)
    if isinstance(prompt, str):  # TRL tokenizes a plain text with the tokenizer's special tokens (a BOS)
        ids = [*tok(prompt + trace["target"], split_special_tokens=True).input_ids, tok.eos_token_id]
        prompt_ids, trained = tok(prompt, split_special_tokens=True).input_ids, [1] * len(ids)
    else:
        tools = json.loads(trace["tools"]) if trace.get("tools") else None
        completion = trace.get("messages") or [{"role": "assistant", "content": trace["target"]}]
        conversation = [*prompt, *completion]
        if assistant_only:
            ids, trained = template.render_masked(tok, conversation, tools)
        else:  # no generation markers needed (SmolLM2's own template has none)
            ids = template.render_ids(tok, conversation, tools)
            trained = [1] * len(ids)
        prompt_ids = template.render_ids(tok, prompt, tools, add_generation_prompt=True)
    start = common_prefix_length(prompt_ids, ids)  # where TRL starts the completion
    return {"input_ids": ids, "assistant_masks": [int(i >= start and m) for i, m in enumerate(trained)]}


def _prompt(trace: dict[str, Any], fmt: FormatParams) -> list[dict[str, str]] | str:
    prompt = formats.prompt(trace["prompt"], fmt)
    if not trace.get("history"):
        return prompt
    if isinstance(prompt, str):
        raise InputError("format.template: plain cannot hold a retry trace's turns; retry traces need a chat template")
    return [*prompt, *trace["history"]]


def episodes(traces: list[dict[str, Any]]) -> bool:
    """Whether some trace is an episode (tool calls and their results): then SFT trains on the assistant's turns
    only (the chat template's generation markers, as TRL's assistant_only_loss), never on what a tool wrote."""
    return any("messages" in t for t in traces)


def train(job: SFTJob) -> JobResult:
    """Fine-tune the job's init model on its traces; the result lands in work_dir/final. Per-step
    metrics go to the active MLflow run (rung.train.run_log)."""
    params, model_dir, traces = job.params, job.init, files.read_jsonl(job.data)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = trainable(model_dir, job.cpu_matmul, job.device)
    config = SFTConfig(
        **common_args(job.seed, job.work_dir, job.dtype, params.save_steps, job.device),
        max_steps=params.max_steps or -1,
        num_train_epochs=params.epochs or 1.0,
        learning_rate=params.learning_rate,
        per_device_train_batch_size=params.per_device_train_batch_size,
        gradient_accumulation_steps=params.gradient_accumulation_steps,
        warmup_steps=params.warmup_ratio,  # transformers 5: a float < 1 is a ratio of the steps
        lr_scheduler_type="cosine",
        max_length=params.max_length,
        packing=params.packing,
    )
    trainer = SharedPrefixSFT(
        model=model,
        args=config,
        train_dataset=examples(traces, job.format, tok),
        processing_class=tok,
        peft_config=peft_config(params.lora),
        callbacks=job.trainer_callbacks(),
    )
    kept = trainer.train_dataset
    assert isinstance(kept, Sized)  # examples() is a map-style Dataset, and TRL keeps it one
    if not len(kept):  # TRL drops an example whose trained tokens were all cut
        raise InputError(
            f"sft.max_length: {params.max_length} tokens cut all trained tokens of every one of the {len(traces)} "
            "traces (the chat template's prompt counts, an episode's tool schemas too): raise it"
        )
    trained = fit_and_save(trainer, job, tok)
    return JobResult(
        metrics={
            **trained,
            "examples": float(len(traces)),
            "truncated_fraction": truncated_fraction(traces, job.format, tok, params.max_length),
        }
    )


def truncated_fraction(traces: list[dict[str, Any]], fmt: FormatParams, tok: Any, max_length: int) -> float:
    """Share of examples (templated prompt and target, or episode with its tools) longer than max_length tokens:
    the trainer cuts their ends."""
    if not traces:
        return 0.0
    return sum(len(ids) > max_length for ids in examples(traces, fmt, tok)["input_ids"]) / len(traces)


if __name__ == "__main__":
    main(SFTJob, train)
