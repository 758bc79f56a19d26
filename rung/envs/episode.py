"""One episode's grading, shared by the built-in environments: the row it answers, every answer graded by the
task's own verifier, tool calls and their errors, and whether the grader itself failed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rung.answers.grading import grade
from rung.answers.rows import Problem
from rung.config import FormatParams


@dataclass
class Episode:
    """A built-in environment's grader state for its episode in progress: its `episode` attribute (an attribute,
    so TRL does not take it for a tool). It lives in the environment because TRL's own loop (FinalAnswer, SFT
    traces) runs environments without rung's; rung's loop copies each graded answer into the turn it was given
    at, and the episode as recorded is the loop's rung.envs.trajectory.Trajectory. `answers`/`correct` hold
    every graded answer in order."""

    row: Problem
    """What the grader reads of the row the episode answers (rung.answers.rows.problem of reset's columns)."""
    fmt: FormatParams
    answers: list[str | None] = field(default_factory=list)
    correct: list[bool | None] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    unscored: str | None = None
    """Why the grader failed (the sandbox or the verifier, not the model), or None. Such an episode is left
    out of training and evaluation (reward None: NaN in TRL), never counted wrong."""

    def grade(self, text: str) -> bool | None:
        """Record `text` as an answer: its answer where the format puts it (strict, as rewards read it),
        whether the task's verifier accepts it; None (and the episode unscored) if the verifier failed."""
        graded = grade(text, self.row, self.fmt)
        self.unscored = self.unscored or graded.unscored
        self.answers.append(graded.answer)
        self.correct.append(graded.correct)
        return graded.correct


def _text(completion: Any) -> str:
    # TRL passes a conversational completion as its messages; the episode's answer is the last one's content.
    return (completion[-1]["content"] or "") if isinstance(completion, list) else completion


class FinalAnswer:
    """A reward function with TRL's signature for environments that keep an `episode` but never see the final
    answer (TRL's loop shows an environment only its tool calls): the last assistant message graded by the
    task's verifier, 1.0 or 0.0; None (unscored, NaN in TRL) when the sandbox or the verifier failed during
    the episode. Pass it in `reward_funcs`; TRL gives reward functions the rollouts' `environments`."""

    __name__ = "final_answer"

    def __call__(self, completions: list[Any], environments: list[Any], **_: Any) -> list[float | None]:
        scores: list[float | None] = []
        for completion, env in zip(completions, environments, strict=True):
            ok = env.episode.grade(_text(completion))
            scores.append(None if env.episode.unscored is not None or ok is None else float(ok))
        return scores
