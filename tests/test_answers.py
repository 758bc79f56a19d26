"""Answer extraction, verification, worked solutions and rewards on literal completions."""

from __future__ import annotations

import ast

import pytest

from rung.answers import formats
from rung.answers.verify import bare, is_correct, is_known_task
from rung.config import FormatParams
from rung.data.solutions import arithmetic_steps

FMT = FormatParams()
ROW = {"task": "basic_arithmetic", "prompt": "Calculate 5 - 3.", "answer": "2", "meta": {"expression": "5 - 3"}}


@pytest.mark.parametrize(
    "completion, strict, lenient",
    [
        ("5 - 3 = 2\nAnswer: 2", "2", "2"),
        ("Answer: 1\nwait\nAnswer: 2", "2", "2"),  # the last answer line wins
        ("The result is 2.", None, "2"),
        ("Answer:", None, None),  # an empty answer line is no answer
        ("no numbers here", None, None),
        ("  Answer:  -14  ", "-14", "-14"),
    ],
)
def test_extract(completion, strict, lenient):
    assert formats.extract(completion, FMT) == strict
    assert formats.extract_lenient(completion, FMT) == lenient


def test_custom_prefix_and_target():
    fmt = FormatParams(answer_prefix="####")
    assert formats.target("7", "3 + 4 = 7", fmt) == "3 + 4 = 7\n#### 7"
    assert formats.target("7", None, fmt) == "#### 7"
    assert formats.extract("3 + 4 = 7\n#### 7", fmt) == "7"


def test_verify_uses_reasoning_gym_scorer():
    assert is_correct("2", ROW)
    assert not is_correct("3", ROW)
    assert not is_correct(None, ROW)
    assert not is_correct("12", ROW)  # reasoning-gym would give 0.5 partial credit
    assert is_known_task("chain_sum") and not is_known_task("no_such_task")


GOLD_FORMS = ["{}", "${}$", "$${}$$", "\\({}\\)", "\\[{}\\]", "\\boxed{{{}}}", " $ {} $ "]


@pytest.mark.parametrize("form", GOLD_FORMS)
@pytest.mark.parametrize(
    ("value", "right", "wrong"),
    [
        ("12\\%", "12\\%", "13\\%"),
        ("\\frac{1}{2}", "0.5", "\\frac{1}{3}"),
        ("\\sqrt{2}", "\\sqrt{2}", "2"),
        ("7", "7", "8"),
    ],
)
def test_math_golds_grade_the_same_in_every_delimiter(form, value, right, wrong):
    # a gold written with its delimiters ($12\%$) once parsed to nothing, grading every answer wrong
    row = {"task": "math", "answer": form.format(value), "prompt": "?", "meta": {}}
    assert is_correct(right, row) and is_correct(form.format(right), row)
    assert not is_correct(wrong, row)


@pytest.mark.parametrize(
    ("written", "expected"),
    [
        ("$12\\%$", "12\\%"),
        ("\\(x^2\\)", "x^2"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("$\\boxed{7}$", "7"),
        ("$5$ and $6$", "$5$ and $6$"),
        ("\\boxed{1} or \\boxed{2}", "\\boxed{1} or \\boxed{2}"),
        ("\\boxed{a} b}", "\\boxed{a} b}"),
        ("$", "$"),
        ("", ""),
    ],
)
def test_bare_strips_only_delimiters_around_the_whole_answer(written, expected):
    assert bare(written) == expected


@pytest.mark.parametrize("expr", ["5 - 3", "2 - -1", "( -9 / 9 )", "3 + 4 * 2 - 6 / 3", "-(3 + 4) * 2", "1 - 4 - 8"])
def test_arithmetic_steps_end_at_the_value(expr):
    steps = arithmetic_steps(expr)
    assert steps is not None
    final = float(steps.split(" = ")[-1])
    assert final == pytest.approx(eval(compile(ast.parse(expr, mode="eval"), "<expr>", "eval")))


def test_arithmetic_steps_refuses_non_arithmetic():
    assert arithmetic_steps("2 ** 3") is None
    assert arithmetic_steps("x + 1") is None
