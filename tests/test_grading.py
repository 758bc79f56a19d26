"""One grading path (rung.answers.grading.grade) read by every caller, and the row's one derivation into an RL
dataset's columns and back (rung.answers.rows)."""

from __future__ import annotations

import pytest
from datasets import Dataset

from rung.answers import verify
from rung.answers.grading import grade
from rung.answers.rows import dataset_row, problem
from rung.config import FormatParams, RLStageParams
from rung.data import traces
from rung.envs import Episode
from rung.eval.evaluate import grade as grade_records
from rung.generate.completion import Completion
from rung.rl.rewards import Accuracy, Guarded
from rung.rl.trainers import prompts

FMT = FormatParams()
ROW = {
    "id": "r",
    "source": "s",
    "task": "basic_arithmetic",
    "prompt": "Calculate 5 - 3.",
    "answer": "2",
    "meta": {"expression": "5 - 3", "difficulty": {"min_terms": 2}},
}
BROKEN = {**ROW, "task": "math", "answer": "\\frac{1}{0}", "meta": {}}
"""A gold math-verify fails on (a zoo): every answer to it is unscored."""
# (completion, row): in the format and right, in the format and wrong, right without the format, no answer,
# a hedge, and one the grader fails on
CASES = [
    ("5 - 3 = 2\nAnswer: 2", ROW),
    ("Answer: 3", ROW),
    ("5 - 3 = 2", ROW),
    ("I do not know.", ROW),
    ("Answer: 2 (or maybe 3)", ROW),
    ("Answer: 5", BROKEN),
]


def test_grade_reads_the_answer_where_the_format_puts_it_and_never_calls_a_failed_grader_wrong():
    strict = [grade(text, row, FMT) for text, row in CASES]
    assert [(g.answer, g.correct, g.follows) for g in strict] == [
        ("2", True, True),
        ("3", False, True),
        (None, False, False),
        (None, False, False),
        ("2 (or maybe 3)", False, True),
        ("5", None, True),
    ]
    assert [g.unscored is None for g in strict] == [True] * 5 + [False]
    assert "math-verify failed" in strict[-1].unscored
    with pytest.raises(verify.GraderFailed, match="math-verify failed"):
        strict[-1].verdict()
    lenient = [grade(text, row, FMT, lenient=True) for text, row in CASES]
    assert [(g.answer, g.correct) for g in lenient[:4]] == [("2", True), ("3", False), ("2", True), (None, False)]


def test_every_caller_grades_as_grade():
    """Rewards, evaluation, an environment's episode and SFT traces give each completion grade's verdict."""
    expected = [grade(text, row, FMT).correct for text, row in CASES]
    columns = {k: [dataset_row(row, FMT)[k] for _, row in CASES] for k in ("answer", "task", "prompt_text", "meta")}
    reward = Guarded(Accuracy(FMT, RLStageParams()), "accuracy", group=1)
    assert reward([text for text, _ in CASES], **columns) == [None if e is None else float(e) for e in expected]
    for (text, row), ok in zip(CASES, expected, strict=True):
        episode = Episode(problem(row), FMT)
        assert episode.grade(text) is ok and (episode.unscored is None) == (ok is not None)
        if ok is None:
            with pytest.raises(verify.GraderFailed):
                grade_records([row], [[Completion(text, 1, False)]], FMT)
            with pytest.raises(verify.GraderFailed):
                traces.graded(text, row, FMT)
            continue
        [record] = grade_records([row], [[Completion(text, 1, False)]], FMT)
        assert record["samples"][0]["correct"] is ok
        assert record["samples"][0]["correct_lenient"] is grade(text, row, FMT, lenient=True).correct
        got = traces.graded(text, row, FMT)
        assert got is None or got[1] is grade(text, row, FMT, lenient=True).correct


def test_an_rl_dataset_row_is_derived_and_read_back_in_one_place():
    """The dataset holds meta as JSON (one schema for every row); what the grader and reset() read of it is the
    curated row's, meta a mapping."""
    other = {**ROW, "id": "o", "task": "math", "answer": "\\frac{1}{2}", "meta": {"level": 3}}
    dataset = prompts([ROW, other], FMT)
    assert dataset.column_names == ["prompt", "prompt_text", "answer", "task", "meta"]
    assert (
        isinstance(dataset, Dataset) and dataset[0]["meta"] == '{"difficulty": {"min_terms": 2}, "expression": "5 - 3"}'
    )
    for columns, row in zip(dataset, [ROW, other], strict=True):
        assert problem(columns) == {k: row[k] for k in ("task", "prompt", "answer", "meta")}
        assert problem(row) == problem(columns)  # a curated row's own columns read the same
    # a curated row whose prompt the format made messages of (evaluation's episodes): the problem is the user turn
    messages = {**ROW, "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "5 - 3?"}]}
    assert problem(messages)["prompt"] == "5 - 3?" and problem(messages)["meta"] == ROW["meta"]
