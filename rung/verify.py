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


def is_correct(answer: str | None, row: dict[str, Any]) -> bool:
    """Whether `answer` is right for a curated row (task, answer, prompt, meta).

    Only a full score counts: reasoning-gym's default scorer gives partial credit when the
    reference is a substring of the answer ('114' for '14'), which a policy learns to exploit.
    """
    if answer is None:
        return False
    meta = row["meta"]
    entry = {
        "question": row["prompt"],
        "answer": row["answer"],
        "metadata": json.loads(meta) if isinstance(meta, str) else meta,
    }
    return _scorer(row["task"])(answer, entry) >= 1.0
