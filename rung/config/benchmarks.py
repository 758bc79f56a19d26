"""Benchmarks known by name: where each lives on the Hugging Face hub and how its columns read.

`{type: benchmark, name: math500}` in params.yaml is an `hf` source with these fields filled in;
any of them can be set to override (a pinned `revision`, another `split`, a local copy as `dataset`).
Hub ids, splits and column names as published on the dataset cards, and as lighteval / open-r1
load them.
"""

from __future__ import annotations

from typing import Any

BENCHMARKS: dict[str, dict[str, Any]] = {
    # 500 MATH test problems of "Let's Verify Step by Step"; `level` (1-5) and `subject` go to meta.
    "math500": {
        "dataset": "HuggingFaceH4/MATH-500",
        "split": "test",
        "columns": {"prompt": "problem", "answer": "answer", "solution": "solution"},
    },
    # 1319 grade-school word problems; the answer column is the worked solution then '#### <number>'.
    "gsm8k": {
        "dataset": "openai/gsm8k",
        "config": "main",
        "split": "test",
        "columns": {"prompt": "question", "answer": "answer"},
        "answer_from": "gsm8k",
    },
    # AIME 2024 I and II, 30 problems, integer answers.
    "aime24": {
        "dataset": "HuggingFaceH4/aime_2024",
        "split": "train",
        "columns": {"prompt": "problem", "answer": "answer", "solution": "solution"},
    },
    # 83 AMC 12 2022-2023 problems; answers are stored as floats (142.0), read as "142".
    "amc": {
        "dataset": "AI-MO/aimo-validation-amc",
        "split": "train",
        "columns": {"prompt": "problem", "answer": "answer"},
    },
}


def fields(name: str, given: dict[str, Any]) -> dict[str, Any]:
    """The source fields of benchmark `name` overridden by `given` (columns merged key by key).

    Raises KeyError for an unknown name.
    """
    spec = BENCHMARKS[name]
    columns = {**spec["columns"], **given.get("columns", {})}
    return {**spec, **given, "columns": columns}
