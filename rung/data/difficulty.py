"""Offline difficulty: per-prompt pass rate from N rollouts of a reference model, and a keep-window.

Prompts whose N rewards are all equal give GRPO a zero gradient ("Vanishing Gradients in RFT");
open-r1 keeps pass rates in [0.1, 0.6] from 8 generations. The pass rate is graded as the RL
accuracy reward grades (the formatted answer, rung.rl.rewards.Accuracy), so that a prompt's offline rate and the rewards
its RL groups get measure the same thing (the pools curriculum mixes the two). With an environment the N samples
are episodes run through rung's one episode loop (rung.envs.loop.per_row, as evaluation runs them), each graded
by its final answer, so the pass rate measures what multi-turn RL trains.
"""

from __future__ import annotations

from collections import Counter
from statistics import mean
from typing import TYPE_CHECKING, Any

from rung import files, paths
from rung.answers import formats
from rung.answers.grading import grade
from rung.answers.rows import Row
from rung.answers.verify import GraderFailed
from rung.config import DifficultyParams, FormatParams
from rung.errors import InputError

if TYPE_CHECKING:  # types only: torch is imported by whoever loads the model (tasks.generation), after the preflight
    from rung.envs.spec import Environment
    from rung.generate.completion import Generator


def episode_texts(
    gen: Generator,
    environment: Environment,
    rows: list[Row],
    fmt: FormatParams,
    params: DifficultyParams,
    seed: int,
) -> list[list[str]]:
    """Each row's `num_generations` episodes as their final answers' texts (the last assistant turn, as
    evaluation grades an episode). A grader that failed inside an episode stops the stage in one line, as in
    evaluation: an unscored episode is never counted wrong."""
    from rung.envs import loop  # the episode loop imports TRL's tool parsing: after the preflight

    samples = loop.per_row(gen, environment, rows, fmt, params.sampling, params.num_generations, seed)
    for row, trajectories in zip(rows, samples, strict=True):
        for t in trajectories:
            if t.unscored is not None:
                raise GraderFailed(f"difficulty row {row['id']}: the environment's grader failed: {t.unscored}")
    return [[t.turns[-1]["text"] if t.turns else "" for t in trajectories] for trajectories in samples]


def pass_rates(
    gen: Generator,
    rows: list[Row],
    fmt: FormatParams,
    params: DifficultyParams,
    seed: int,
    environment: Environment | None = None,
) -> list[dict[str, Any]]:
    """One score record per row: pass rate over `num_generations` samples (with `environment`: episodes, by
    their final answers), graded as the accuracy reward grades (the answer where the format puts it); and
    beside it the lenient pass rate (the last number counts), which says how much of a low rate is the format
    rather than the problem.
    """
    if environment is None:
        prompts = gen.render([formats.prompt(r["prompt"], fmt) for r in rows])
        samples = gen.generate(prompts, params.sampling, n=params.num_generations, seed=seed, desc="difficulty")
        all_texts = [[c.text for c in completions] for completions in samples]
    else:
        all_texts = episode_texts(gen, environment, rows, fmt, params, seed)
    out = []
    for row, texts in zip(rows, all_texts, strict=True):
        scores = [float(grade(t, row, fmt).verdict()) for t in texts]  # as rung.rl.rewards.Accuracy
        rate = mean(scores)
        out.append(
            {
                "id": row["id"],
                "source": row["source"],
                "pass_rate": rate,
                "bucket": bucket(rate, params.buckets),
                "scores": scores,
                "lenient_pass_rate": mean(float(grade(t, row, fmt, lenient=True).verdict()) for t in texts),
            }
        )
    return out


def bucket(pass_rate: float, buckets: dict[str, float]) -> str:
    """The bucket with the smallest inclusive upper bound that holds the rate."""
    return min((upper, name) for name, upper in buckets.items() if pass_rate <= upper)[1]


def keep(scores: list[dict[str, Any]], params: DifficultyParams) -> set[str]:
    """Ids whose pass rate lies in the keep-window."""
    return {s["id"] for s in scores if params.pass_rate_min <= s["pass_rate"] <= params.pass_rate_max}


def summarize(scores: list[dict[str, Any]], kept: int) -> dict[str, Any]:
    rates = [s["pass_rate"] for s in scores]
    return {
        "prompts": len(scores),
        "kept": kept,
        "mean_pass_rate": mean(rates),
        "mean_lenient_pass_rate": mean(s["lenient_pass_rate"] for s in scores),
        "zero_variance_fraction": mean(float(len(set(s["scores"])) == 1) for s in scores),
        "unsolved_fraction": mean(float(r == 0) for r in rates),
        "solved_fraction": mean(float(r == 1) for r in rates),
        "buckets": dict(sorted(Counter(s["bucket"] for s in scores).items())),
    }


def histogram(scores: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Prompt counts per pass rate (DVC plot data)."""
    counts = Counter(round(s["pass_rate"], 4) for s in scores)
    return [{"pass_rate": r, "prompts": c} for r, c in sorted(counts.items())]


def run(
    gen: Generator,
    rows: list[Row],
    fmt: FormatParams,
    params: DifficultyParams,
    seed: int,
    environment: Environment | None = None,
) -> dict[str, Any]:
    """The difficulty stage: score `rows` (single-turn, or episodes of `environment`), write the scores, the
    filtered train set (rows carry their pass rate and bucket, which curricula and per-bucket RL metrics read)
    and the pass-rate histogram at their layout paths; returns the summary."""
    scores = pass_rates(gen, rows, fmt, params, seed, environment)
    kept = keep(scores, params)
    if not kept:
        raise InputError(
            f"difficulty: no prompt has a pass rate in [{params.pass_rate_min}, {params.pass_rate_max}]; "
            "widen the window"
        )
    files.write_jsonl(paths.SCORES, scores)
    by_id = {s["id"]: {"pass_rate": s["pass_rate"], "bucket": s["bucket"]} for s in scores}
    files.write_jsonl(paths.FILTERED, [{**r, **by_id[r["id"]]} for r in rows if r["id"] in kept])
    files.write_json(paths.plot("difficulty", "pass_rate"), histogram(scores))
    return summarize(scores, len(kept))
