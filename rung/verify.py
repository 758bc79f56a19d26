"""Decide whether an extracted answer is correct, with the task's own verifier."""
from __future__ import annotations

import json
from functools import cache
from typing import Any, Callable

import reasoning_gym


@cache
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    return reasoning_gym.get_score_answer_fn(task)


def is_known_task(task: str) -> bool:
    try:
        _scorer(task)
    except (KeyError, ValueError):
        return False
    return True


def score(answer: str | None, row: dict[str, Any]) -> float:
    """Score in [0, 1] of `answer` for a curated row (task, answer, prompt, meta)."""
    if answer is None:
        return 0.0
    meta = row["meta"]
    entry = {
        "question": row["prompt"],
        "answer": row["answer"],
        "metadata": json.loads(meta) if isinstance(meta, str) else meta,
    }
    return float(_scorer(row["task"])(answer, entry))
