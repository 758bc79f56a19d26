"""Evaluation of one checkpoint on the held-out split: accuracy, format compliance, lengths."""
from __future__ import annotations

from collections import defaultdict
from statistics import mean
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rung import answer_format
from rung.config import FormatParams, SamplingParams
from rung.generation import Completion, generate, render
from rung.verify import is_correct


def grade(rows: list[dict[str, Any]], completions: list[Completion], fmt: FormatParams) -> list[dict[str, Any]]:
    """One record per (row, completion): the answer found, whether it is correct, and lengths."""
    records = []
    for row, c in zip(rows, completions, strict=True):
        strict = answer_format.extract(c.text, fmt)
        lenient = answer_format.extract_lenient(c.text, fmt)
        records.append(
            dict(id=row["id"], source=row["source"], task=row["task"], prompt=row["prompt"], answer=row["answer"],
                 completion=c.text, extracted=strict, correct=is_correct(strict, row),
                 correct_lenient=is_correct(lenient, row), formatted=strict is not None,
                 tokens=c.tokens, truncated=c.truncated)
        )
    return records


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Headline metrics plus accuracy per source."""
    by_source: dict[str, list[float]] = defaultdict(list)
    for r in records:
        by_source[r["source"]].append(float(r["correct"]))
    return {
        "n": len(records),
        "accuracy": mean(float(r["correct"]) for r in records),
        "accuracy_lenient": mean(float(r["correct_lenient"]) for r in records),
        "format_rate": mean(float(r["formatted"]) for r in records),
        "mean_tokens": mean(r["tokens"] for r in records),
        "truncation_rate": mean(float(r["truncated"]) for r in records),
        "accuracy_by_source": {k: mean(v) for k, v in sorted(by_source.items())},
    }


def evaluate(model: PreTrainedModel, tok: PreTrainedTokenizerBase, rows: list[dict[str, Any]], fmt: FormatParams, sampling: SamplingParams, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Generate one completion per row and grade it; returns (records, metrics)."""
    prompts = render(tok, [answer_format.messages(r["prompt"], fmt) for r in rows])
    completions = [c[0] for c in generate(model, tok, prompts, sampling, n=1, seed=seed, desc="eval")]
    records = grade(rows, completions, fmt)
    return records, summarize(records)
