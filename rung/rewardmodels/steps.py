"""Monte-Carlo step labels (Math-Shepherd, Wang et al. 2024; "Rewarding Progress", Setlur et al. 2024): a
sampled solution split into steps; from each step's prefix `rollouts` continuations, graded by the verifier;
a step's label is the share that reach the right answer (soft: an estimate of the prefix's value) or whether
any does (hard: the prefix can still be completed)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rung.answers import formats
from rung.answers.rows import Row
from rung.config import FormatParams, ProcessRewardModelParams
from rung.rewardmodels.encoding import text_ids
from rung.rewardmodels.pairs import right

if TYPE_CHECKING:  # types only: torch is imported by whoever loads the model (tasks.generation)
    from rung.generate.completion import Generator


def split(text: str, splitter: str) -> list[str]:
    """`text` cut after each match of the regular expression `splitter`, the match kept at the end of its step
    (so that the steps join back into the text); a step of whitespace alone joins the one before it."""
    steps: list[str] = []
    start = 0
    for m in re.finditer(splitter, text):
        if m.end() > start:
            steps.append(text[start : m.end()])
            start = m.end()
    steps.append(text[start:])
    out: list[str] = []
    for s in steps:
        if out and not s.strip():
            out[-1] += s
        elif s:
            out.append(s)
    return out


def label(outcomes: list[bool], kind: str) -> float:
    """A step's label from its continuations' grades: soft, the share right; hard, 1 if any is."""
    if kind == "hard":
        return float(any(outcomes))
    return sum(outcomes) / len(outcomes)


def labelled(
    gen: Generator, rows: list[Row], fmt: FormatParams, params: ProcessRewardModelParams, seed: int
) -> list[dict[str, Any]]:
    """Each row's `solutions_per_prompt` sampled solutions, split into steps (the first
    `max_steps_per_solution`), each step labelled by `rollouts` continuations of its prefix."""
    prompts = gen.render([formats.prompt(r["prompt"], fmt) for r in rows])
    samples = gen.generate(prompts, params.sampling, n=params.solutions_per_prompt, seed=seed, desc="solutions")
    solutions = [
        (row, prompt, split(c.text, params.splitter)[: params.max_steps_per_solution])
        for row, prompt, done in zip(rows, prompts, samples, strict=True)
        for c in done
    ]
    solutions = [s for s in solutions if s[2]]
    prefixes = [(i, "".join(steps[: j + 1])) for i, (_, _, steps) in enumerate(solutions) for j in range(len(steps))]
    continuations = gen.generate(
        [solutions[i][1] + text_ids(gen.tok, prefix) for i, prefix in prefixes],
        params.sampling,
        n=params.rollouts,
        seed=seed + 1,
        desc="step rollouts",
    )
    outcomes: dict[int, list[float]] = {}
    for (i, prefix), done in zip(prefixes, continuations, strict=True):
        row = solutions[i][0]
        outcomes.setdefault(i, []).append(label([right(prefix + c.text, row, fmt) for c in done], params.labels))
    return [
        {
            "id": row["id"],
            "prompt": row["prompt"],
            "bucket": row.get("bucket", "all"),
            "steps": steps,
            "labels": outcomes[i],
        }
        for i, (row, _, steps) in enumerate(solutions)
    ]
