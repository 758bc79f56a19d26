"""Episodes' metrics (issue #47, item 5): per eval set the multi-turn analogue of pass@k (success within t
turns), first-answer accuracy, mean turns, tool calls per episode, the tool error rate and the share cut at
max_turns.

Pure functions on episodes (rung.envs.trajectory.Trajectory: from the loop, or an eval record's `episode` parsed
back), so a stage, RL's per-step log and a test compute them alike; the keys depend on max_turns only, so runs
with the same environment have the same keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from rung.envs import loop
from rung.envs.trajectory import Trajectory


def solved_at(episode: Trajectory) -> int | None:
    """The turn (1-based) of the episode's first right answer, None if it has none or the grader failed."""
    if episode.unscored is not None:
        return None
    return next((i for i, t in enumerate(episode.turns, 1) if t["correct"]), None)


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


def metrics(episodes: Sequence[Trajectory], max_turns: int) -> EpisodeMetrics:
    """The metrics of an eval set's episodes run with `max_turns`."""
    if not episodes:
        raise ValueError("no episodes")
    graded = [e for e in episodes if e.unscored is None and e.correct is not None]
    solved = [solved_at(e) for e in graded]
    calls = sum(e.tool_calls for e in episodes)
    n = len(episodes)
    return EpisodeMetrics(
        episodes=n,
        graded=len(graded),
        success_within={str(t): _share([s is not None and s <= t for s in solved]) for t in range(1, max_turns + 1)},
        first_answer_accuracy=_share([e.first_correct is True for e in graded]),
        mean_turns=sum(len(e.turns) for e in episodes) / n,
        tool_calls_per_episode=calls / n,
        tool_error_rate=sum(e.tool_errors for e in episodes) / calls if calls else None,
        cut_at_max_turns=sum(e.cut for e in episodes) / n,
        truncated=sum(e.truncated for e in episodes) / n,
        unscored=sum(e.unscored is not None for e in episodes),
    )


run = loop.per_row
"""`n` episodes of an environment per row (rung.envs.loop.per_row): evaluation's and difficulty scoring's loop."""
