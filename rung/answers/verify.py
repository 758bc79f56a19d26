"""Decide whether an extracted answer is correct, with the task's own verifier."""

from __future__ import annotations

import ast
import re
import threading
from collections.abc import Callable, Hashable
from fractions import Fraction
from functools import cache, lru_cache
from typing import Any

import math_verify
import sympy
from math_verify.errors import TimeoutException
from math_verify.grader import is_assignment_relation, take_last_relation
from math_verify.utils import timeout

from rung import sandbox
from rung.answers import numbers
from rung.answers.latex import last_boxed
from rung.answers.rows import Problem

MATH = "math"
"""Task name of rows whose answers are checked by math-verify rather than a reasoning-gym scorer."""
CODE = "code"
"""Task name of rows whose answers are Python code, run against the row's tests in rung.sandbox."""
CODE_LIMITS = sandbox.Limits(wall=10.0, cpu=5)
"""Per execution: HumanEval's canonical solutions take well under a second each (docs/sandbox.md)."""


class GraderFailed(RuntimeError):
    """The grader itself failed (the code sandbox, not the code it ran; math-verify's error or time-out):
    the answer is unscored, not wrong."""


# reasoning_gym is imported where a task of its own is graded: math rows, the generation and the
# trainers run without it (on a GPU node, where its dependency cellpylib has no wheel).
@cache
def _scorer(task: str) -> Callable[[str | None, dict[str, Any]], float]:
    import reasoning_gym

    return reasoning_gym.get_score_answer_fn(task)


MATH_TIMEOUT = 5
"""Seconds math-verify may spend on one parse or one comparison before the grade is a GraderFailed."""


def _timeout() -> int | None:
    # math-verify's timeout uses SIGALRM, which only the main thread may set; elsewhere (e.g. a
    # Prefect task thread) it raises, so run without it (answers are short).
    return MATH_TIMEOUT if threading.current_thread() is threading.main_thread() else None


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
    raw string. math-verify's own errors and time-outs raise GraderFailed (by default it logs them and
    returns [], which would grade the answer wrong).
    """
    try:
        return math_verify.parse(
            f"${bare(answer)}$", fallback_mode="no_fallback", parsing_timeout=_timeout(), raise_on_error=True
        )
    except (Exception, TimeoutException) as e:  # TimeoutException is a BaseException
        raise GraderFailed(f"math-verify failed to parse {answer[:80]!r}: {e!r}") from e


def _math_equal(gold: list[Any], answer: str) -> bool:
    """math-verify's verdict on an answer against a parsed gold (parse_math); its errors and time-outs
    raise GraderFailed instead of counting as 'not equal'."""
    parsed = parse_math(answer)
    try:
        return math_verify.verify(gold, parsed, timeout_seconds=_timeout(), raise_on_error=True)
    except (Exception, TimeoutException) as e:
        raise GraderFailed(f"math-verify failed to compare {answer[:80]!r} with the gold: {e!r}") from e


def _number(value: sympy.Basic) -> Fraction | str:
    """A real number to 6 decimals, as math-verify rounds before comparing a float (verify's float_rounding)."""
    if value.is_Rational:
        return round(Fraction(int(value.p), int(value.q)), 6)
    approx = sympy.N(value, 30)
    if abs(approx) >= 10**24:  # its 30 digits are all it has (and Fraction("1e10000000000") would build that int)
        return str(approx)
    return round(Fraction(str(approx)), 6)


# Hand-written: math-verify compares two answers (verify) but gives no canonical form of one.
def _canonical(expr: Any) -> Hashable:
    """A canonical form of one parsed answer, equal for answers math-verify calls equal in the usual cases:
    a finite number by its value to 6 decimals (0.5, 1/2 and \\frac{1}{2} one answer; \\sqrt{2} and
    1.414214 too), `x = 5` as 5 (verify unwraps an assignment), anything else (sets, intervals,
    expressions, matrices) by sympy's printed form with its floats rounded the same way. Where they
    differ: verify also calls 2(x+1) and 2x+2 equal (simplify), here two forms; and verify is not
    transitive (1/3 and 333333/1000000 each equal 0.333333, not each other), here all three are one."""
    if isinstance(expr, sympy.Basic) and is_assignment_relation(expr):
        expr = take_last_relation(expr).rhs
    if isinstance(expr, sympy.Basic) and expr.is_number:
        value = expr if expr.is_Rational else sympy.N(expr, 30)  # evalf, not doit: 10^{10^{10}} stays cheap
        if value.is_finite:
            re, im = value.as_real_imag()
            return ("number", _number(re), _number(im))
    if isinstance(expr, (sympy.Basic, sympy.MatrixBase)):
        floats = {f: sympy.Rational(_number(f)) for f in expr.atoms(sympy.Float)}
        return ("expr", str(expr.xreplace(floats) if floats else expr))
    return ("text", str(expr))


def _math_class(answer: str) -> Hashable:
    value = numbers.single(bare(answer))
    if value is not None:  # one number in a standard form, as is_correct reads it: _canonical's form of it
        return ("number", round(value, 6), Fraction(0))
    parsed = parse_math(answer)
    if not parsed:  # no expression: verify calls it equal to nothing, but the same string is one answer
        return ("unparsed", answer)
    try:
        return timeout(_timeout())(_canonical)(parsed[0])
    except (Exception, TimeoutException) as e:
        raise GraderFailed(f"no canonical form of {answer[:80]!r}: {e!r}") from e


def _as_number(answer: str) -> str:
    """A single number in a standard form written one way (`1,000` and `1.0e3` as `1000`), as is_correct
    reads it; any other answer as it is."""
    value = numbers.single(bare(answer))
    return answer if value is None else numbers.written(value)


def answer_class(row: Problem) -> Callable[[str], Hashable]:
    """A function giving an answer to `row` its class under the row's grader, each answer graded once:
    answers of one class are one answer (maj@k's vote, rung.eval.metrics). A single number in a standard
    form is classed by its value (`1,000` and `1.0e3` as `1000`), as is_correct reads it; other math answers
    are parsed once and put in a canonical form (_canonical); code and reasoning-gym tasks with the default scorer
    (exact string match) compare strings; any other reasoning-gym scorer has no canonical form, so a new
    answer is graded against one answer of each class so far, as reference: quadratic in the distinct
    answers, but a scorer call costs microseconds where a math-verify comparison costs milliseconds."""
    if row["task"] == MATH:
        return _math_class
    if row["task"] == CODE:  # the grader runs the tests; it never calls two programs the same answer
        return lambda answer: answer
    import reasoning_gym.dataset

    if getattr(_scorer(row["task"]), "__func__", None) is reasoning_gym.dataset.ProceduralDataset.score_answer:
        return _as_number
    reps: list[str] = []

    def first_equal(answer: str) -> Hashable:
        match = next((r for r in reps if is_correct(answer, {**row, "answer": r})), None)
        if match is None:
            reps.append(answer)
        return answer if match is None else match

    return first_equal


def is_known_task(task: str) -> bool:
    """'math', 'code' or a registered reasoning-gym dataset (including 'composite')."""
    if task in (MATH, CODE):
        return True
    import reasoning_gym.factory

    return task in reasoning_gym.factory.DATASETS


def is_correct(answer: str | None, row: Problem) -> bool:
    """Whether `answer` (an answer already read from a completion: rung.answers.grading.grade reads and grades
    one) is right for a row.

    Only a full score counts: reasoning-gym's default scorer gives partial credit when the
    reference is a substring of the answer ('114' for '14'), which a policy learns to exploit. Nor does
    a hedge ('12 (or maybe 13)') or an answer of several candidate values, in any task; a number in a
    standard form ('1,000', '1.5e3', '1 1/2', '−3') is that number in every task (rung.answers.numbers).
    Raises GraderFailed when the grader itself fails (math-verify, the code sandbox): unscored, not wrong.
    """
    if answer is None:
        return False
    meta = row["meta"]
    if row["task"] == CODE:
        return passes_tests(answer, meta["test"], meta["entry_point"], meta.get("context", ""))
    # One reading of numbers and hedges before every family's scorer, so that each grades a form alike.
    decided = numbers.verdict(bare(answer), bare(row["answer"]))
    if decided is not None:
        return decided
    if row["task"] == MATH:
        gold = parse_math(row["answer"])
        return bool(gold) and _math_equal(gold, answer)
    entry = {"question": row["prompt"], "answer": row["answer"], "metadata": meta}
    return _scorer(row["task"])(answer, entry) >= 1.0


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
