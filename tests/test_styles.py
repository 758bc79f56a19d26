"""The three answer dialects (rung.answers.formats): one table of literal completions, each read by its
style's strict extraction and format check and judged against a gold answer by math-verify, as
open-r1 judges math answers."""

from __future__ import annotations

import pytest

from rung.answers import formats
from rung.answers.verify import is_correct
from rung.config import FormatParams, SolutionTraces
from rung.data import traces
from rung.errors import InputError

LINE, BOXED, TAGS = (FormatParams(style=s) for s in ("answer_line", "boxed", "tags"))
THINK = "<think>\n12 + 30 = 42\n</think>\n"

# (format, completion, gold, strict extraction, follows the format, judged correct against gold)
CASES = [
    # answer_line
    (LINE, "6 * 7 = 42\nAnswer: 42", "42", "42", True, True),
    (LINE, "so the Answer: 12", "12", "12", True, True),  # mid-line
    (LINE, "Answer: 12 apples", "12", "12 apples", True, True),  # math-verify reads past a unit
    (LINE, "Answer: 3\nno, wait\nAnswer: 4", "4", "4", True, True),  # the last line wins
    (LINE, "Answer: $\\frac{1}{2}$.", "0.5", "\\frac{1}{2}", True, True),  # delimiters and period dropped
    (LINE, "Answer: 1,000", "1000", "1,000", True, True),  # thousands separator
    (LINE, "Answer: -3", "-3", "-3", True, True),
    (LINE, "Answer: 50\\%", "50", "50\\%", True, True),  # a percentage equals its number
    (LINE, "Answer:   ", "7", None, False, False),  # an empty answer is no answer
    (LINE, "The result is 7.", "7", None, False, False),  # right number, no answer line
    (LINE, "Answer: 0.25", "\\frac{1}{4}", "0.25", True, True),  # decimal vs fraction gold
    (LINE, "Answer: 2/3", "\\frac{2}{3}", "2/3", True, True),
    (LINE, "Answer: 13", "12", "13", True, False),
    (LINE, "answer: 12", "12", None, False, False),  # the prefix is case-sensitive
    (LINE, "Answer: x = 5", "5", "x = 5", True, True),  # math-verify reads the right-hand side
    # boxed
    (BOXED, "So $x = \\boxed{42}$.", "42", "42", True, True),
    (BOXED, "\\boxed{\\frac{1}{2}}", "0.5", "\\frac{1}{2}", True, True),  # nested braces
    (BOXED, "\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt{3}}{2}", True, True),
    (BOXED, "first \\boxed{3}, then \\boxed{4}", "4", "4", True, True),  # several boxes: the last counts
    (BOXED, "first \\boxed{4}, then \\boxed{3}", "4", "3", True, False),
    (BOXED, "\\boxed{12 \\text{ apples}}", "12", "12 \\text{ apples}", True, True),  # box with text
    (BOXED, "\\boxed{\\text{12}}", "12", "\\text{12}", True, True),
    (BOXED, "\\boxed{}", "5", None, False, False),  # an empty box is no answer
    (BOXED, "The answer is 5.", "5", None, False, False),  # no box
    (BOXED, "\\boxed{5", "5", None, False, False),  # unbalanced: no box
    (BOXED, "\\boxed 5", "5", "5", True, True),  # the brace-less form
    (BOXED, "\\fbox{7}", "7", "7", True, True),
    (BOXED, "\\boxed{0.75}", "\\frac{3}{4}", "0.75", True, True),  # decimal vs fraction
    (BOXED, "\\boxed{75\\%}", "75", "75\\%", True, True),  # percentage
    (BOXED, "\\boxed{-\\frac{2}{3}}", "-\\frac{2}{3}", "-\\frac{2}{3}", True, True),  # negative fraction
    (BOXED, "\\boxed{1,234}", "1234", "1,234", True, True),  # thousands separator
    (BOXED, "\\boxed{(1, 2)}", "(1,2)", "(1, 2)", True, True),  # a tuple
    (BOXED, "\\boxed{x^2+2x+1}", "(x+1)^2", "x^2+2x+1", True, True),  # symbolic equality
    (BOXED, "\\boxed{\\dfrac{1}{3}}", "\\frac13", "\\dfrac{1}{3}", True, True),
    (BOXED, "\\boxed{0.33}", "\\frac{1}{3}", "0.33", True, False),  # close is not equal
    # tags
    (TAGS, THINK + "<answer>\n42\n</answer>", "42", "42", True, True),
    (TAGS, "<think> 12 + 30 = 42 </think> <answer> 42 </answer>", "42", "42", True, True),  # spaces, not newlines
    (TAGS, "  <think>a</think>\n\n<answer>42</answer>\n", "42", "42", True, True),  # surrounding whitespace
    (TAGS, THINK + "<answer>\n42", "42", None, False, False),  # missing closing tag
    (TAGS, "<answer>42</answer>", "42", "42", False, True),  # no reasoning: answer read, format not followed
    (TAGS, THINK + "<answer></answer>", "42", None, False, False),  # empty answer
    (TAGS, THINK + "<answer>\\frac{1}{2}</answer>", "0.5", "\\frac{1}{2}", True, True),
    (TAGS, THINK + "<answer>$-7$</answer>", "-7", "-7", True, True),
    (TAGS, THINK + "<answer>The answer is \\boxed{9}</answer>", "9", "The answer is \\boxed{9}", True, True),
    (TAGS, THINK + "<answer>1</answer><answer>2</answer>", "2", "2", False, True),  # two answers: not the format
    (TAGS, THINK + "<answer>42</answer> trailing words", "42", "42", False, True),  # text after the answer
    (TAGS, "<think>unfinished reasoning", "42", None, False, False),
]


@pytest.mark.parametrize(
    "fmt, completion, gold, strict, follows, correct", CASES, ids=[f"{c[0].style}-{i}" for i, c in enumerate(CASES)]
)
def test_style_table(fmt, completion, gold, strict, follows, correct):
    assert formats.extract(completion, fmt) == strict
    assert formats.follows_format(completion, fmt) is follows
    assert is_correct(formats.extract(completion, fmt), {"task": "math", "answer": gold, "meta": {}}) is correct


def test_table_covers_each_style_with_at_least_40_cases():
    assert len(CASES) >= 40
    assert {c[0].style for c in CASES} == {"answer_line", "boxed", "tags"}


@pytest.mark.parametrize(
    "completion, lenient",
    [
        (THINK + "<answer>\n42", "42"),  # the closing tag cut off by max_new_tokens
        ("<think>so it is 41, no 42", "42"),  # no answer tag: the last number
        ("no numbers", None),
    ],
)
def test_tags_lenient_extraction(completion, lenient):
    assert formats.extract_lenient(completion, TAGS) == lenient


@pytest.mark.parametrize(
    "completion, credit",
    [
        (THINK + "<answer>\n42\n</answer>", 1.0),
        (THINK + "<answer>\n42", 0.75),
        ("<think>x</think><think>y</think><answer>1</answer>", 0.5),  # repeated tags earn nothing
        ("42", 0.0),
    ],
)
def test_tags_partial_credit_is_open_r1_tag_count(completion, credit):
    assert formats.style(TAGS).partial_credit(completion) == credit


@pytest.mark.parametrize("fmt", [LINE, BOXED, TAGS], ids=lambda f: f.style)
@pytest.mark.parametrize(
    "answer, solution", [("42", "6 * 7 = 42"), ("\\frac{1}{2}", None), ("-3", "Subtract.\nIt is -3.")]
)
def test_targets_follow_their_own_format(fmt, answer, solution):
    target = formats.target(answer, solution, fmt)
    assert formats.follows_format(target, fmt)
    assert formats.extract(target, fmt) == answer


def test_boxed_target_keeps_a_solution_that_already_has_its_box():
    solution = "Half of one is $\\boxed{\\frac{1}{2}}$."
    assert formats.target("\\frac{1}{2}", solution, BOXED) == solution


def test_prompts_chat_and_plain():
    assert formats.prompt("What is 2+2?", BOXED) == [
        {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
        {"role": "user", "content": "What is 2+2?"},
    ]
    appended = FormatParams(style="boxed", system_message=False)
    assert formats.prompt("What is 2+2?", appended) == [
        {
            "role": "user",
            "content": "What is 2+2?\nPlease reason step by step, and put your final answer within \\boxed{}.",
        }
    ]
    r1_zero = FormatParams(style="tags", template="plain")
    text = formats.prompt("What is 2+2?", r1_zero)
    assert text.startswith("A conversation between User and Assistant.") and text.endswith(
        "\nUser: What is 2+2?\nAssistant:"
    )
    custom = FormatParams(template="plain", instruction="", plain_template="Q: {prompt}\nA:")
    assert formats.prompt("What is 2+2?", custom) == "Q: What is 2+2?\nA:"


def test_solution_targets_that_break_the_style_are_refused_naming_the_source():
    rows = [
        {"id": "a", "prompt": "1+1?", "answer": "2", "solution": "1+1=2", "task": "math", "meta": {}},
        {
            "id": "b",
            "prompt": "2+2?",
            "answer": "4",
            "solution": "<think>2+2</think><answer>4</answer>",
            "task": "math",
            "meta": {},
        },
    ]
    assert len(traces.from_solutions(rows[:1], SolutionTraces(), TAGS)) == 1
    with pytest.raises(
        InputError, match=r"^sft.traces\[1\]: 1 of 2 solution targets .* format.style tags \(first: id b\)"
    ):
        traces.from_solutions(rows, SolutionTraces(), TAGS, "sft.traces[1]")
    wrong_box = [
        {**rows[0], "solution": "So it is $\\boxed{3}$."}
    ]  # the solution's box disagrees with the answer column
    with pytest.raises(InputError, match="format.style boxed"):
        traces.from_solutions(wrong_box, SolutionTraces(), BOXED)


def test_a_sample_is_kept_as_a_trace_only_if_it_ends_in_the_format():
    row = {"id": "a", "prompt": "1+1?", "answer": "2", "task": "math", "meta": {}}
    assert traces.in_format("1+1 is 2", row, TAGS) == "<think>\n1+1 is 2\n</think>\n<answer>\n2\n</answer>"
    assert traces.in_format("<think>1+1 is 2", row, TAGS) is None  # its own stray tag would be doubled
    assert traces.in_format("1+1 is 3", row, BOXED) is None
    assert traces.in_format("1+1 is 2", row, BOXED) == "1+1 is 2\nThe final answer is $\\boxed{2}$."


def test_chat_prompts_need_a_chat_template_plain_ones_do_not(tiny_model):
    from rung import models
    from rung.generate.completion import render

    tok = models.load_tokenizer(tiny_model)
    tok.chat_template = None  # a base model's tokenizer
    plain = formats.prompt("1+1?", FormatParams(style="tags", template="plain"))
    assert render(tok, [plain]) == [plain]
    with pytest.raises(InputError, match="^format.template: chat, but the model's tokenizer has no chat template"):
        render(tok, [formats.prompt("1+1?", TAGS)])
