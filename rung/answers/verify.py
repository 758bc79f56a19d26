"""Decide whether an extracted answer is correct, with the task's own verifier."""

from __future__ import annotations

import ast
import json
import re
import threading
from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any

import math_verify

from rung import sandbox
from rung.answers.latex import last_boxed

MATH = "math"
"""Task name of rows whose answers are checked by math-verify rather than a reasoning-gym scorer."""
CODE = "code"
"""Task name of rows whose answers are Python code, run against the row's tests in rung.sandbox."""
CODE_LIMITS = sandbox.Limits(wall=10.0, cpu=5)
"""Per execution: HumanEval's canonical solutions take well under a second each (docs/sandbox.md)."""


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


# An answer's own math delimiters, outermost first: `$$…$$` before `$…$`.
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


def bare(answer: str) -> str:
    """The answer without the delimiters it was written in: `$12\\%$`, `\\(12\\%\\)`, `\\[…\\]` and a
    `\\boxed{…}` around the whole answer all give `12\\%`."""
    text = answer.strip()
    while True:
        whole = re.fullmatch(r"\\boxed\s*\{(.*)\}", text, re.S)
        if whole and text.count("\\boxed") == 1 and last_boxed(text) == whole.group(1).strip():
            text = whole.group(1).strip()
            continue
        for left, right in _DELIMITERS:
            inner = text[len(left) : -len(right)]
            if (
                len(text) > len(left) + len(right)
                and text.startswith(left)
                and text.endswith(right)
                and left not in inner
                and right not in inner
            ):
                text = inner.strip()
                break
        else:
            return text


def parse_math(answer: str) -> list[Any]:
    """Parse an answer with math-verify, the same way for references and model answers.

    The bare answer is wrapped in `$...$`: math-verify's LaTeX extractor needs delimiters, so
    `parse("\\sqrt{2}")` gives [] and `parse("10^{10}")` gives [10]; wrapped they parse to sqrt(2)
    and 10**10. An answer written with its own delimiters (`$12\\%$`) is unwrapped first: wrapped
    twice it parses to nothing, and every answer to it would be graded wrong. `no_fallback` makes
    an answer that yields no expression ("See the proof above.") come back as [] instead of as its
    raw string.
    """
    return math_verify.parse(f"${bare(answer)}$", fallback_mode="no_fallback", parsing_timeout=_timeout())


def is_known_task(task: str) -> bool:
    """'math', 'code' or a registered reasoning-gym dataset (including 'composite')."""
    if task in (MATH, CODE):
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
    meta = row["meta"]
    meta = json.loads(meta) if isinstance(meta, str) else meta
    if row["task"] == CODE:
        return passes_tests(answer, meta["test"], meta["entry_point"], meta.get("context", ""))
    if row["task"] == MATH:
        gold = parse_math(row["answer"])
        return bool(gold) and math_verify.verify(gold, parse_math(answer), timeout_seconds=_timeout())
    entry = {"question": row["prompt"], "answer": row["answer"], "metadata": meta}
    return _scorer(row["task"])(answer, entry) >= 1.0


class GraderFailed(RuntimeError):
    """The sandbox itself failed (not the code it ran): the answer is unscored, not wrong."""


@lru_cache(maxsize=8192)  # strict and lenient extraction, and a group's duplicate samples, often agree
def passes_tests(code: str, tests: str, entry_point: str, context: str = "") -> bool:
    """Whether `code` passes `tests` in the sandbox: run after `context` (a problem's imports and helpers,
    so a completion may rely on them), the tests calling `entry_point`. A grader failure is retried once,
    then raised (GraderFailed): RL leaves such a completion out (rung.rl.rewards.Guarded), eval stops."""
    program = sandbox.Program(f"{context}\n\n{code}" if context else code, tests, entry_point, context)
    for _ in range(2):
        result = sandbox.run(program, CODE_LIMITS)
        if result.scored:
            return result.passed
    raise GraderFailed(f"the code sandbox failed twice: {result.detail}")


def tests_passed_share(code: str, tests: str, entry_point: str, context: str = "") -> float:
    """The share of a problem's tests that `code` passes: tests written as top-level asserts (the
    functions generator's, MBPP's) run one per sandbox, in parallel; any other form (HumanEval's
    `check(candidate)`) is one test, so 0 or 1. Raises GraderFailed as passes_tests does."""
    try:
        body = ast.parse(tests).body
    except SyntaxError:
        body = []
    if len(body) < 2 or not all(isinstance(node, ast.Assert) for node in body):
        return float(passes_tests(code, tests, entry_point, context))
    solution = f"{context}\n\n{code}" if context else code
    programs = [sandbox.Program(solution, ast.unparse(node), entry_point, context) for node in body]
    results = sandbox.run_many(programs, workers=2, limits=CODE_LIMITS)
    if not all(r.scored for r in results):
        raise GraderFailed(f"the code sandbox failed: {next(r.detail for r in results if not r.scored)}")
    return sum(r.passed for r in results) / len(results)
