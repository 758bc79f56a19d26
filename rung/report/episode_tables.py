"""The tables of an experiment with an environment (rung.eval.episodes), as the pipeline report shows them
(rung.report.pipeline): each checkpoint's episode metrics, the paired tests of first answers, and a whole
episode's messages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rung.eval.results import Comparisons, EvalResult
from rung.report.tables import Table, interval, mcnemar_p, pct, per_set, verdict

EPISODE_PROMPTS = 3
"""Whole episodes the report shows: the first prompts of the held-out split, for each checkpoint."""


def episode_table(evals: Mapping[str, EvalResult], set_name: str) -> Table:
    """The greedy episodes' metrics of each checkpoint evaluated on `set_name` with episodes (SetMetrics.episodes):
    success within t turns for t = 1..max_turns, first-answer accuracy, mean turns, tool calls per episode, tool
    error rate, cut at max_turns. No rows without episodes."""
    found = {c: e for c, m in evals.items() if set_name in m.sets and (e := m.sets[set_name].episodes)}
    if not found:
        return [], []
    turns = sorted({t for e in found.values() for t in e["success_within"]}, key=int)
    header = ["checkpoint", "episodes", *(f"success within {t}" for t in turns), "first answer", "mean turns"]
    header += ["tool calls / episode", "tool error rate", "cut at max_turns"]

    def share(v: float | None) -> str:
        return "—" if v is None else pct(v)

    rows = [
        [
            checkpoint,
            str(e["episodes"]),
            *(share(e["success_within"].get(t)) for t in turns),
            share(e["first_answer_accuracy"]),
            f"{e['mean_turns']:.2f}",
            f"{e['tool_calls_per_episode']:.2f}",
            share(e["tool_error_rate"]),
            pct(e["cut_at_max_turns"]),
        ]
        for checkpoint, e in found.items()
    ]
    return header, rows


FIRST_ANSWER_NOTE = (
    "With episodes the greedy table compares the final answers; this one the first answers (the first one each "
    "episode states: retry's before any feedback), with the same exact McNemar test on the prompts whose first "
    "answer flipped. The final- and first-answer tests of a pair on a set are one family (same prompts, same "
    "checkpoints): their p (here and in the greedy table) are Holm-adjusted over the two, so that the pair's "
    'verdicts together say "different" by chance at most at the level; each verdict names its test.'
)


def first_answer_rows(result: Comparisons) -> list[list[str]]:
    """The paired comparisons' first-answer tests (GreedyTest.first_answer), as the greedy table's rows."""
    return [
        [
            label,
            name,
            str(f.n),
            f"{pct(f.accuracy_old)} → {pct(f.accuracy_new)}",
            interval(f.difference, f.ci_low, f.ci_high),
            str(f.right_to_wrong),
            str(f.wrong_to_right),
            mcnemar_p(f),
            verdict(f),
        ]
        for label, name, g in per_set(result.comparisons)
        if (f := g.first_answer) is not None
    ]


def episode_messages(episode: Mapping[str, Any]) -> list[tuple[str, str]]:
    """An episode's conversation as (role, text) pairs: each message's content and, for an assistant's tool
    calls, `name(arguments as JSON)`; the text is raw (the caller escapes or fences it). `episode` is an eval
    record's (rung.envs.trajectory.Trajectory dumped), read as JSON: its messages are all the report shows, and
    importing rung.envs would put torch and the environments' code in the report stage."""
    out = []
    for m in episode["messages"]:
        calls = [c.get("function", c) for c in m.get("tool_calls") or []]
        text = "\n".join(
            [
                *([str(m["content"])] if m.get("content") else []),
                *(f"→ {c['name']}({json.dumps(c.get('arguments'), ensure_ascii=False)})" for c in calls),
            ]
        )
        out.append((str(m["role"]), text))
    return out
