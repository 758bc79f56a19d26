"""SFT warm-start with TRL's SFTTrainer: completion-only loss on chat-formatted traces, optional
LoRA (peft) and packing."""

from __future__ import annotations

import json
from typing import Any

from datasets import Dataset
from transformers import AutoTokenizer
from trl import SFTConfig

from rung import files
from rung.answers import formats
from rung.config import FormatParams
from rung.errors import InputError
from rung.train.harness import common_args, finalize, fit, peft_config, train_loss, trainable
from rung.train.jobs import JobResult, SFTJob, main
from rung.train.prefix import SharedPrefixSFT


def examples(traces: list[dict[str, Any]], fmt: FormatParams) -> Dataset:
    """Prompt/completion pairs, conversations for a chat template or plain text (TRL appends EOS):
    TRL masks the prompt, so only the response is learned. A retry trace's `history` (a wrong answer, the
    feedback) ends its prompt. An episode's completion is its messages, with its tools' schemas in a `tools`
    column (TRL renders them into the prompt); see `episodes`."""
    rows = [{"prompt": _prompt(t, fmt), "completion": _completion(t["target"], fmt)} for t in traces]
    if not episodes(traces):
        return Dataset.from_list(rows)
    return Dataset.from_list(
        [
            {**row, "completion": t.get("messages") or row["completion"], "tools": t.get("tools")}
            for row, t in zip(rows, traces, strict=True)
        ]
    )


def _prompt(trace: dict[str, Any], fmt: FormatParams) -> list[dict[str, str]] | str:
    prompt = formats.prompt(trace["prompt"], fmt)
    if not trace.get("history"):
        return prompt
    if isinstance(prompt, str):
        raise InputError("format.template: plain cannot hold a retry trace's turns; retry traces need a chat template")
    return [*prompt, *trace["history"]]


def episodes(traces: list[dict[str, Any]]) -> bool:
    """Whether some trace is an episode (tool calls and their results): then SFT trains on the assistant's turns
    only (TRL's assistant_only_loss, by the chat template's generation markers), never on what a tool wrote."""
    return any("messages" in t for t in traces)


def _completion(target: str, fmt: FormatParams) -> list[dict[str, str]] | str:
    return target if fmt.template == "plain" else [{"role": "assistant", "content": target}]


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
        completion_only_loss=True,
        assistant_only_loss=episodes(traces),
        packing=params.packing,
    )
    trainer = SharedPrefixSFT(
        model=model,
        args=config,
        train_dataset=examples(traces, job.format),
        processing_class=tok,
        peft_config=peft_config(params.lora),
        callbacks=job.trainer_callbacks(),
    )
    if not len(trainer.train_dataset):  # TRL drops an example whose trained tokens were all cut
        raise InputError(
            f"sft.max_length: {params.max_length} tokens cut all trained tokens of every one of the {len(traces)} "
            "traces (the chat template's prompt counts, an episode's tool schemas too): raise it"
        )
    fit(trainer, job.resume, job.outage_wait)
    moved = finalize(trainer, tok, job.work_dir, job.init)
    return JobResult(
        metrics={
            **moved,
            "train_loss": train_loss(trainer.state),
            "steps": float(trainer.state.global_step),
            "examples": float(len(traces)),
            "truncated_fraction": truncated_fraction(traces, job.format, tok, params.max_length),
        }
    )


def truncated_fraction(traces: list[dict[str, Any]], fmt: FormatParams, tok: Any, max_length: int) -> float:
    """Share of examples (templated prompt and target, or episode with its tools) longer than max_length tokens:
    the trainer cuts their ends."""
    if not traces:
        return 0.0
    plain = fmt.template == "plain"  # TRL tokenizes a plain text with the tokenizer's special tokens (BOS)
    texts = [
        f"{p}{t['target']}{tok.eos_token}"
        if isinstance(p := _prompt(t, fmt), str)
        else tok.apply_chat_template(
            [*p, *(t.get("messages") or [{"role": "assistant", "content": t["target"]}])],
            tools=json.loads(t["tools"]) if t.get("tools") else None,
            tokenize=False,
        )
        for t in traces
    ]
    return sum(len(ids) > max_length for ids in tok(texts, add_special_tokens=plain)["input_ids"]) / len(traces)


if __name__ == "__main__":
    main(SFTJob, train)
