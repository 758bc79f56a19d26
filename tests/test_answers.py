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


# Every task family that grades numbers: math-verify, reasoning-gym's exact match (basic_arithmetic), its
# decimal reward (chain_sum) and its first-number regex (gsm_symbolic). Each grades the same form the same way.
NUMBER_FAMILIES = ["math", "basic_arithmetic", "chain_sum", "gsm_symbolic"]
THIN, NARROW = "\u2009", "\u202f"


@pytest.mark.parametrize("task", NUMBER_FAMILIES)
@pytest.mark.parametrize(
    ("answer", "gold", "right"),
    [
        # hedges and several candidate values: wrong, whichever candidate is the gold
        ("12 (or maybe 13)", "13", False),
        ("12 (or maybe 13)", "12", False),
        ("The answer is 5 but I'm not sure, maybe 6", "5", False),
        ("12 (13)", "25", False),
        ("12 (13)", "12", False),
        ("12, 13", "12", False),
        ("5 or 6", "5", False),
        ("5, probably", "5", False),
        ("maybe 5", "5", False),
        ("5?", "5", False),
        ("approximately 5", "5", False),
        ("12 (thirteen)", "12", False),
        ("x = 2 or x = 3", "3", False),
        # a number in a standard form is that number
        ("1.5e3", "1500", True),
        ("1.5E+3", "1500", True),
        ("1.5 \\times 10^{3}", "1500", True),
        ("1.5e3", "3", False),
        ("1 1/2", "1.5", True),
        ("1\\frac{1}{2}", "1.5", True),
        ("1 1/2", "1", False),
        (f"12{THIN}345", "12345", True),
        (f"12{NARROW}345", "12345", True),
        ("12\\,345", "12345", True),
        (f"12{THIN}345", "345", False),
        ("1,000", "1000", True),
        ("1,000,000", "1000000", True),
        ("1,000", "1", False),
        ("3.0", "3", True),
        ("3.50", "3.5", True),
        ("\u22123", "-3", True),
        ("\u22123", "3", False),
        ("twelve", "12", True),
        ("twenty-three", "23", True),
        # legitimate answers stay right
        ("-3", "-3", True),
        ("+3", "3", True),
        ("x = 4", "4", True),
        ("\\boxed{12}", "12", True),
        ("$12$", "12", True),
        ("\\frac{3}{4}", "0.75", True),
        ("1/2", "0.5", True),
        ("5 apples", "5", True),
        ("12", "12", True),
        ("12", "13", False),
        ("1,2", "12", False),
    ],
)
def test_every_family_grades_number_forms_and_hedges_alike(task, answer, gold, right):
    row = {"task": task, "answer": gold, "prompt": "?", "meta": {}}
    assert is_correct(answer, row) is right


@pytest.mark.parametrize(
    ("answer", "gold", "right"),
    [
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", True),
        ("x^2 + 2x + 1", "(x+1)^2", True),
        ("2, 3", "2, 3", True),
        ("\\frac{3}{4}", "\\frac{3}{4}", True),
        ("3/4", "\\frac{3}{4}", True),
        ("x^2 + 1, maybe", "x^2+1", False),
        ("\\sqrt{2} or \\sqrt{3}", "\\sqrt{2}", False),
    ],
)
def test_math_expressions_are_not_numbers_but_hedges_still_fail(answer, gold, right):
    assert is_correct(answer, {"task": "math", "answer": gold, "prompt": "?", "meta": {}}) is right


@pytest.mark.parametrize("style", ["answer_line", "boxed", "tags"])
def test_a_hedge_is_wrong_in_every_answer_format(style):
    fmt = FormatParams(style=style)
    row = {"task": "basic_arithmetic", "answer": "12", "prompt": "?", "meta": {}}
    for answer, right in [("12", True), ("1,2", False), ("12 (or maybe 13)", False), ("12.0", True)]:
        completion = formats.target(answer, "Some steps.", fmt)
        assert is_correct(formats.extract(completion, fmt), row) is right, (style, answer)
