"""Grading a completion: its answer read where the format puts it (rung.answers.formats), checked by the task's
verifier (rung.answers.verify). Rewards, difficulty scoring, evaluation, the environments' episodes and SFT
traces all grade through `grade`, so a model is trained, filtered and evaluated on one reading of its answers."""

from __future__ import annotations

from dataclasses import dataclass

from rung.answers import formats, verify
from rung.answers.rows import Problem
from rung.config import FormatParams


@dataclass(frozen=True)
class Grade:
    """One completion graded."""

    answer: str | None
    """The answer read from the completion (strict: where the format puts it; lenient: else its last number),
    None when it states none."""
    correct: bool | None
    """Whether the task's verifier accepts `answer` (no answer: False); None when the grader itself failed."""
    follows: bool
    """Whether the completion passes the style's strict format check."""
    unscored: str | None = None
    """Why the grader failed (math-verify, the code sandbox; not the model), or None."""

    def verdict(self) -> bool:
        """`correct`, for a caller that cannot leave a completion unscored: raises GraderFailed where the grader
        failed (a reward leaves the completion out, rung.rl.rewards.Guarded; a stage stops in one line)."""
        if self.correct is None:
            raise verify.GraderFailed(self.unscored)
        return self.correct


def grade(completion: str, row: Problem, fmt: FormatParams, lenient: bool = False) -> Grade:
    """`completion` graded for `row`: its answer where the format puts it, or with `lenient` the formatted
    answer if present, else the last number of the text (for models that do not follow the format yet)."""
    answer = formats.extract_lenient(completion, fmt) if lenient else formats.extract(completion, fmt)
    follows = formats.follows_format(completion, fmt)
    try:
        return Grade(answer, verify.is_correct(answer, row), follows)
    except verify.GraderFailed as e:
        return Grade(answer, None, follows, str(e))
