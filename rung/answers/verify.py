"""Decide whether an extracted answer is correct, with the task's own verifier."""
from __future__ import annotations

import json
import threading
from functools import cache
from typing import Any, Callable

import math_verify

MATH = "math"
"""Task name of rows whose answers are checked by math-verify rather than a reasoning-gym scorer."""


# reasoning_gym is imported where a task of its own is graded: math rows, the generation and the
# trainers run without it (on a GPU node, where its dependency cellpylib has no wheel).
@cache
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


def _timeout() -> int | None:
    # math-verify's timeout uses SIGALRM, which only the main thread may set; elsewhere (e.g. a
    # Prefect task thread) it raises, so run without it (answers are short).
    return 5 if threading.current_thread() is threading.main_thread() else None


def parse_math(answer: str) -> list[Any]:
    """Parse an answer with math-verify, the same way for references and model answers.

    The answer is wrapped in `$...$`: bare, math-verify's LaTeX extractor needs delimiters, so
    `parse("\\sqrt{2}")` gives [] and `parse("10^{10}")` gives [10]; wrapped they parse to sqrt(2)
    and 10**10. `no_fallback` makes an answer that yields no expression ("See the proof above.")
    come back as [] instead of as its raw string.
    """
    return math_verify.parse(f"${answer}$", fallback_mode="no_fallback", parsing_timeout=_timeout())


def is_known_task(task: str) -> bool:
    """'math' or a registered reasoning-gym dataset (including 'composite')."""
    if task == MATH:
        return True
    import reasoning_gym.factory

    return task in reasoning_gym.factory.DATASETS


def is_correct(answer: str | None, row: dict[str, Any]) -> bool:
    """Whether `answer` is right for a curated row (task, answer, prompt, meta).

    Only a full score counts: reasoning-gym's default scorer gives partial credit when the
    reference is a substring of the answer ('114' for '14'), which a policy learns to exploit.
    """
    if answer is None:
        return False
    if row["task"] == MATH:
        gold = parse_math(row["answer"])
        return bool(gold) and math_verify.verify(gold, parse_math(answer), timeout_seconds=_timeout())
    meta = row["meta"]
    entry = {
        "question": row["prompt"],
        "answer": row["answer"],
        "metadata": json.loads(meta) if isinstance(meta, str) else meta,
    }
    return _scorer(row["task"])(answer, entry) >= 1.0
