"""Episodes in evaluation records and their metrics (issue #47, item 5): what an eval record's `episode` field
holds, and per eval set the multi-turn analogue of pass@k (success within t turns), first-answer accuracy,
mean turns, tool calls per episode, the tool error rate and the share cut at max_turns.

Pure functions on records (JSON-ready dicts), so a stage, the report and a test compute them alike; the keys
depend on max_turns only, so runs with the same environment have the same keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypedDict

from pydantic import BaseModel, ConfigDict

from rung.envs import loop
from rung.envs.loop import Trajectory, Turn


class EpisodeRecord(TypedDict):
    """One episode as an eval record carries it (`episode`): every key always present."""

    turns: list[Turn]
    messages: list[dict[str, Any]]
    first_answer: str | None
    """The first graded answer (for retry: the first turn's, the single-turn answer)."""
    first_correct: bool | None
    answer: str | None
    """The last graded answer: the episode's."""
    correct: bool | None
    """The last graded answer's correctness; None where no answer was graded (an environment rung does not
    grade) or the grader failed."""
    reward: float | None
    tool_calls: int
    tool_errors: int
    cut: bool
    truncated: bool
    unscored: str | None
    tokens: int
    """Tokens the model generated over all turns."""
    env_tokens: int
    """Tool / environment tokens in the episode."""


def record(trajectory: Trajectory) -> EpisodeRecord:
    """The eval record of an episode from rung's loop (rung.envs.loop.run)."""
    turns = trajectory.turns
    graded = [t for t in turns if t["answer"] is not None or t["correct"] is not None]
    return EpisodeRecord(
        turns=[Turn(**t) for t in turns],
        messages=trajectory.messages,
        first_answer=graded[0]["answer"] if graded else None,
        first_correct=graded[0]["correct"] if graded and trajectory.unscored is None else None,
        answer=graded[-1]["answer"] if graded else None,
        correct=graded[-1]["correct"] if graded and trajectory.unscored is None else None,
        reward=trajectory.reward,
        tool_calls=sum(len(t["tool_calls"]) for t in turns),
        tool_errors=sum(t["tool_errors"] for t in turns),
        cut=trajectory.cut,
        truncated=trajectory.truncated,
        unscored=trajectory.unscored,
        tokens=sum(t["tokens"] for t in turns),
        env_tokens=sum(t["env_tokens"] for t in turns),
    )


def solved_at(episode: EpisodeRecord) -> int | None:
    """The turn (1-based) of the episode's first right answer, None if it has none or the grader failed."""
    if episode["unscored"] is not None:
        return None
    return next((i for i, t in enumerate(episode["turns"], 1) if t["correct"]), None)


class EpisodeMetrics(BaseModel):
    """An eval set's episode metrics. Success and first-answer accuracy are over the graded episodes
    (`graded`: unscored ones and those of environments rung does not grade are left out, never counted wrong);
    the rest over all `episodes`."""

    model_config = ConfigDict(extra="forbid")

    episodes: int
    graded: int
    success_within: dict[str, float | None]
    """{"t": share of graded episodes right by turn t} for t = 1..max_turns: the multi-turn pass@k (None: no
    graded episode)."""
    first_answer_accuracy: float | None
    """Share of graded episodes whose first answer is right (retry: first-turn accuracy)."""
    mean_turns: float
    tool_calls_per_episode: float
    tool_error_rate: float | None
    """Tool errors per tool call; None without calls."""
    cut_at_max_turns: float
    truncated: float
    unscored: int

    def flat(self) -> dict[str, Any]:
        """One name per number: `success_within_<t>` for the dict (as eval's `pass_at_<k>`)."""
        out = self.model_dump(exclude={"success_within"})
        return out | {f"success_within_{t}": v for t, v in self.success_within.items()}


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def metrics(episodes: Sequence[EpisodeRecord], max_turns: int) -> EpisodeMetrics:
    """The metrics of an eval set's episodes run with `max_turns`."""
    if not episodes:
        raise ValueError("no episodes")
    graded = [e for e in episodes if e["unscored"] is None and e["correct"] is not None]
    solved = [solved_at(e) for e in graded]
    calls = sum(e["tool_calls"] for e in episodes)
    n = len(episodes)
    return EpisodeMetrics(
        episodes=n,
        graded=len(graded),
        success_within={str(t): _share([s is not None and s <= t for s in solved]) for t in range(1, max_turns + 1)},
        first_answer_accuracy=_share([e["first_correct"] is True for e in graded]),
        mean_turns=sum(len(e["turns"]) for e in episodes) / n,
        tool_calls_per_episode=calls / n,
        tool_error_rate=sum(e["tool_errors"] for e in episodes) / calls if calls else None,
        cut_at_max_turns=sum(e["cut"] for e in episodes) / n,
        truncated=sum(e["truncated"] for e in episodes) / n,
        unscored=sum(e["unscored"] is not None for e in episodes),
    )


run = loop.per_row
"""`n` episodes of an environment per row (rung.envs.loop.per_row): evaluation's and difficulty scoring's loop."""
