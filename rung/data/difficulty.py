"""Offline difficulty: per-prompt pass rate from N rollouts of a reference model, and a keep-window.

Prompts whose N rewards are all equal give GRPO a zero gradient ("Vanishing Gradients in RFT");
open-r1 keeps pass rates in [0.1, 0.6] from 8 generations. The pass rate is graded as the RL
accuracy reward grades (the formatted answer, rung.rl.rewards.Accuracy), so that a prompt's offline rate and the rewards
its RL groups get measure the same thing (the pools curriculum mixes the two).
"""

from __future__ import annotations

from collections import Counter
from statistics import mean
from typing import TYPE_CHECKING, Any

from rung import files, paths
from rung.answers import formats
from rung.answers.verify import is_correct
from rung.config import DifficultyParams, FormatParams
from rung.errors import InputError

if TYPE_CHECKING:  # a type only: torch is imported by whoever loads the model (tasks.generation), after the preflight
    from rung.generate.completion import Generator


def pass_rates(
    gen: Generator, rows: list[dict[str, Any]], fmt: FormatParams, params: DifficultyParams, seed: int
) -> list[dict[str, Any]]:
    """One score record per row: pass rate over `num_generations` samples, graded as the accuracy
    reward grades (the answer where the format puts it); and beside it the lenient pass rate (the
    last number counts), which says how much of a low rate is the format rather than the problem.
    """
    prompts = gen.render([formats.prompt(r["prompt"], fmt) for r in rows])
    samples = gen.generate(prompts, params.sampling, n=params.num_generations, seed=seed, desc="difficulty")
    out = []
    for row, completions in zip(rows, samples, strict=True):
        texts = [c.text for c in completions]
        scores = [float(is_correct(formats.extract(t, fmt), row)) for t in texts]  # as rung.rl.rewards.Accuracy
        rate = mean(scores)
        out.append(
            {
                "id": row["id"],
                "source": row["source"],
                "pass_rate": rate,
                "bucket": bucket(rate, params.buckets),
                "scores": scores,
                "lenient_pass_rate": mean(float(is_correct(formats.extract_lenient(t, fmt), row)) for t in texts),
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
    gen: Generator, rows: list[dict[str, Any]], fmt: FormatParams, params: DifficultyParams, seed: int
) -> dict[str, Any]:
    """The difficulty stage: score `rows`, write the scores, the filtered train set (rows carry
    their pass rate and bucket, which curricula and per-bucket RL metrics read) and the pass-rate
    histogram at their layout paths; returns the summary."""
    scores = pass_rates(gen, rows, fmt, params, seed)
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
