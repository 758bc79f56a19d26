"""Eval records and study runs for the tests of the paired comparisons, the report and a seed
study: the shapes rung.eval.evaluate and rung.report.study write and read."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rung import files
from rung.eval.results import EvalResult


def greedy(correct: list[bool], ids: list[str] | None = None, prefix: str = "") -> list[dict]:
    """Records of one greedy sample per prompt, graded `correct`; ids `ids`, else prefix + 0, 1, ..."""
    ids = ids or [f"{prefix}{i}" for i in range(len(correct))]
    return [{"id": i, "samples": [{"correct": bool(c)}]} for i, c in zip(ids, correct, strict=True)]


def sampled(counts: list[int], n: int) -> list[dict]:
    """Records of n samples per prompt, counts[i] of prompt i's correct."""
    return [{"id": str(i), "samples": [{"correct": j < c} for j in range(n)]} for i, c in enumerate(counts)]


def write_evaluated(root: Path, second_set: str) -> None:
    """data/eval records under `root` of base, sft and rl-main on 60 prompts: greedy on 'test' and
    on `second_set` (its first 20 prompts), and test's samples (n = 3, its first 10 prompts). rl
    turns 12 of sft's wrong prompts right and 5 of its right prompts wrong."""
    rng = np.random.default_rng(0)
    base = rng.random(60) < 0.3
    sft = np.where(rng.random(60) < 0.25, ~base, base)
    rl = sft.copy()
    rl[np.flatnonzero(~sft)[:12]] = True  # 12 wrong -> right ...
    rl[np.flatnonzero(sft)[:5]] = False  # ... and 5 right -> wrong against sft
    for name, correct in {"base": base, "sft": sft, "rl-main": rl}.items():
        d = root / "data/eval" / name
        files.write_jsonl(d / "test.jsonl", greedy(correct))
        files.write_jsonl(d / f"{second_set}.jsonl", greedy(correct[:20]))
        files.write_jsonl(d / "test.samples.jsonl", sampled([int(c) * 3 for c in correct[:10]], n=3))


def study_run(arm: str, seed: int, acc: float, correct: list[bool], *, ood: bool = False) -> dict:
    """One (arm, seed) run of a seed study as rung.report.study reads it: its eval on 'test' (and,
    with `ood`, on 'ood', the records reversed), RL summary, initial eval, records and curve."""
    sets = {
        "test": {
            "accuracy": acc,
            "format_rate": 1.0,
            "mean_tokens": 9.0,
            "truncation_rate": 0.0,
            "n": len(correct),
            "avg@2": acc / 2,
            "pass_at_k": {"1": acc / 2, "2": acc},
            "accuracy_ci": [0, 1],
            "accuracy_by_source": {"a": acc},
        }
    }
    records = {"test": greedy(correct, prefix="p")}
    if ood:
        sets["ood"] = {
            "accuracy": acc / 2,
            "format_rate": 0.5,
            "mean_tokens": 9.5,
            "truncation_rate": 0.1,
            "n": len(correct),
            "accuracy_ci": [0, 1],
            "accuracy_by_source": {"a": acc},
        }
        records["ood"] = greedy(correct[::-1], prefix="p")
    return {
        "arm": arm,
        "seed": seed,
        "eval": EvalResult.model_validate({"sets": sets}),
        "rl": {"steps": 2.0, "reward_last": acc, "frac_reward_zero_std": 0.5},
        "init_eval": EvalResult.model_validate({"sets": {"test": {"n": 4, "accuracy": 0.25}}}),
        "records": records,
        "curve": [
            {"step": 1, "reward": 0.1 * seed, "accuracy": 0.2, "heldout_accuracy": 0.25 + 0.25 * seed},  # eval_every 1
            {"step": 2, "reward": 0.2 * seed, "accuracy": 0.3},
        ],
    }
