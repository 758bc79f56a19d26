"""`retry`: unary feedback after a wrong answer (UFO, "A Simple 'Try Again' Can Elicit Multi-Turn LLM
Reasoning"). The model answers; a wrong answer gets one fixed reply ("Let's try again." by default) as the
next user turn, up to `max_turns` answers; the reward is the correctness of the last answer, optionally
discounted per extra turn. Every answer is recorded, the first one too (first-turn accuracy).

TRL 1.16's loop cannot run this environment: it continues an episode only after a tool call
(GRPOTrainer._tool_call_loop), and an environment never sees a plain answer. It runs in rung's episode loop,
which calls `reply` after each assistant turn without tool calls (rung/envs/__init__.py). It has no tools,
so it needs no tool-capable chat template.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rung.answers.rows import problem
from rung.config import FormatParams
from rung.config.base import Section
from rung.envs.episode import Episode


class RetrySettings(Section):
    """environment.settings of `retry`."""

    feedback: str = Field("Let's try again.", min_length=1)
    """The user's reply to a wrong answer (UFO's unary feedback): the same text every time."""
    discount: float = Field(1.0, gt=0, le=1)
    """A right answer at turn t scores discount**(t-1) (UFO's reward shaping towards fewer turns); 1 keeps
    every right answer at 1."""


class Retry:
    """UFO's retry environment; one instance per rollout (TRL's contract), reused through `reset`."""

    def __init__(self, fmt: FormatParams, max_turns: int, settings: RetrySettings | None = None):
        self.fmt, self.max_turns = fmt, max_turns
        self.settings = settings or RetrySettings()
        self.episode: Episode | None = None

    def reset(self, **columns: Any) -> None:
        """A new episode for one dataset row (TRL passes the row's columns); nothing is added to the prompt."""
        self.episode = Episode(problem(columns), self.fmt)

    def reply(self, message: str) -> str | None:
        """rung's episode loop, after an assistant turn without a tool call: the feedback if the answer is wrong
        and turns are left, else None (the episode ends). A grader failure ends it unscored."""
        episode = self.episode
        assert episode is not None, "reset() starts an episode before any reply"
        ok = episode.grade(message)
        if ok is False and len(episode.answers) < self.max_turns:
            return self.settings.feedback
        return None

    def get_reward(self) -> float | None:
        """The last answer's correctness, discounted per extra turn; None when the grader failed (unscored)."""
        episode = self.episode
        if episode is None or not episode.answers:
            # TRL's own loop never shows this environment an answer: the reward would be made up
            raise RuntimeError("retry was never given an answer: it runs in rung's episode loop, not TRL's")
        last = episode.correct[-1]
        if episode.unscored is not None or last is None:  # None: the grader failed on it
            return None
        return float(last) * self.settings.discount ** (len(episode.answers) - 1)
