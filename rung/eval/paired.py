"""Paired comparisons of two checkpoints that answered the same prompts.

Every checkpoint is evaluated on the same prompts, so the honest way to compare two is prompt by
prompt: the per-prompt differences carry the comparison, not the two accuracies and their separate
intervals. For greedy accuracy rung reports the difference with a paired percentile-bootstrap
interval, the prompts that flip each way, and the exact McNemar test (a two-sided binomial test
on the discordant prompts, from scipy); for avg@n and pass@k, which are per-prompt means over
samples, a paired bootstrap interval of the difference.

Plain functions on per-prompt values (numpy and scipy only), reusable by a seed study: the
bootstrap takes `strata` (e.g. the seed of each row) and then resamples prompts within each
stratum, so every resample keeps each seed's share of the rows.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import binomtest, norm

from rung.eval import metrics
from rung.errors import InputError

Record = dict[str, Any]


def level(confidence: float) -> float:
    """The test level that matches a confidence: 0.95 -> 0.05 (rounded to hide float noise)."""
    return round(1 - confidence, 6)


def verdict(significant: bool, alpha: float) -> str:
    """The words every report uses: 'significant at 0.05' or 'not significant at 0.05'."""
    return f"{'significant' if significant else 'not significant'} at {alpha:g}"


def align(old: Sequence[Record], new: Sequence[Record], what: str) -> list[tuple[Record, Record]]:
    """Pair two checkpoints' records by row id (in `old`'s order); an InputError when the two were
    not evaluated on the same prompts, since then no paired comparison exists."""
    ids_old, ids_new = [r["id"] for r in old], [r["id"] for r in new]
    if len(set(ids_old)) != len(ids_old) or len(set(ids_new)) != len(ids_new):
        raise InputError(f"{what}: duplicate prompt ids in the eval records; cannot pair them")
    by_id = {r["id"]: r for r in new}
    if set(ids_old) != set(by_id):
        only_old, only_new = sorted(set(ids_old) - set(by_id)), sorted(set(by_id) - set(ids_old))
        example = (only_old or only_new)[0]
        raise InputError(
            f"{what}: the two checkpoints were evaluated on different prompts ({len(only_old)} ids only in the first, "
            f"{len(only_new)} only in the second, e.g. {example!r}); rerun their eval stages on the same sets"
        )
    return [(r, by_id[r["id"]]) for r in old]


def paired_bootstrap(
    old: Sequence[float], new: Sequence[float], confidence: float = 0.95, resamples: int = 1000, seed: int = 0,
    strata: Sequence[Any] | None = None,
) -> tuple[float, float, float]:
    """(mean(new - old), low, high): the mean per-prompt difference and its percentile-bootstrap
    interval, resampling prompts (pairs) with replacement; with `strata`, resampling within each
    stratum (e.g. seed), keeping every stratum's size. Deterministic for a given seed."""
    a, b = np.asarray(old, dtype=float), np.asarray(new, dtype=float)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"old and new must be 1-d and of one length, got {a.shape} and {b.shape}")
    if len(a) == 0:
        raise ValueError("nothing to compare: no prompts")
    metrics.check_bootstrap(confidence, resamples)
    d = b - a
    rng = np.random.default_rng(seed)
    if strata is None:
        groups = [np.arange(len(d))]
    else:
        if len(strata) != len(d):
            raise ValueError(f"strata has {len(strata)} labels for {len(d)} prompts")
        labels = np.asarray(strata)
        groups = [np.flatnonzero(labels == s) for s in dict.fromkeys(strata)]  # first-seen order: deterministic
    # One (resamples, n) matrix of indices: each stratum's columns drawn from that stratum only.
    idx = np.concatenate([g[rng.integers(0, len(g), size=(resamples, len(g)))] for g in groups], axis=1)
    means = d[idx].mean(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(d.mean()), float(lo), float(hi)


def mcnemar(old: Sequence[bool], new: Sequence[bool]) -> dict[str, Any]:
    """Exact McNemar test of paired right/wrong outcomes: of the prompts whose outcome differs,
    is 'wrong -> right' as likely as 'right -> wrong'? A two-sided binomial test (p = 0.5) on the
    discordant prompts (scipy.stats.binomtest); p = 1 when none differ."""
    if len(old) != len(new):
        raise ValueError(f"old and new differ in length: {len(old)} vs {len(new)}")
    a, b = np.asarray(old, dtype=bool), np.asarray(new, dtype=bool)
    right_to_wrong, wrong_to_right = int((a & ~b).sum()), int((~a & b).sum())
    discordant = right_to_wrong + wrong_to_right
    p = binomtest(wrong_to_right, discordant, 0.5).pvalue if discordant else 1.0
    return {"right_to_wrong": right_to_wrong, "wrong_to_right": wrong_to_right,
            "both_right": int((a & b).sum()), "both_wrong": int((~a & ~b).sum()), "mcnemar_p": float(p)}


def mcnemar_prompts_needed(right_to_wrong: int, wrong_to_right: int, n: int, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Prompts a paired comparison needs for a two-sided McNemar test at `alpha` to detect, with
    probability `power`, the effect that these flips show (their rates on n prompts taken as the
    truth): Connor's (1987) normal-approximation formula n = (z_{1-alpha/2} sqrt(psi) + z_power
    sqrt(psi - delta^2))^2 / delta^2, with psi = (b + c) / n the discordance and delta = (c - b) / n
    the effect. Written out because statsmodels has no McNemar power (its contingency_tables only
    test). None when the flips balance: no number of prompts detects an effect of zero."""
    if n <= 0 or min(right_to_wrong, wrong_to_right) < 0 or right_to_wrong + wrong_to_right > n:
        raise ValueError(f"flips {right_to_wrong}, {wrong_to_right} do not fit {n} prompts")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha}, {power}")
    psi, delta = (right_to_wrong + wrong_to_right) / n, (wrong_to_right - right_to_wrong) / n
    if delta == 0:
        return None
    root = norm.ppf(1 - alpha / 2) * np.sqrt(psi) + norm.ppf(power) * np.sqrt(psi - delta**2)
    return int(np.ceil(root**2 / delta**2))


def power_note(result: dict[str, Any], unit: str = "prompts") -> str:
    """What a comparison that is not significant would need, for its verdict: ' (needs about N
    prompts at this effect)'; '' for a significant one."""
    if "prompts_needed" not in result:
        return ""
    n = result["prompts_needed"]
    return f" (needs about {n} {unit} at this effect)" if n else " (the flips balance: no effect to detect)"


def compare_greedy(old: Sequence[Record], new: Sequence[Record], confidence: float, resamples: int, seed: int, what: str) -> dict[str, Any]:
    """Greedy accuracy of `new` against `old` (records of one eval set, the first sample graded):
    difference with its paired bootstrap interval, flips each way, exact McNemar p and verdict."""
    pairs = align(old, new, what)
    a = [bool(o["samples"][0]["correct"]) for o, _ in pairs]
    b = [bool(n["samples"][0]["correct"]) for _, n in pairs]
    diff, lo, hi = paired_bootstrap(a, b, confidence, resamples, seed)
    test = mcnemar(a, b)
    alpha = level(confidence)
    significant = test["mcnemar_p"] < alpha
    # Not significant: how many prompts would make this effect significant (80% power)?
    needed = {} if significant else {"prompts_needed": mcnemar_prompts_needed(test["right_to_wrong"], test["wrong_to_right"], len(pairs), alpha)}
    return {"n": len(pairs), "accuracy_old": float(np.mean(a)), "accuracy_new": float(np.mean(b)),
            "difference": diff, "ci_low": lo, "ci_high": hi, **test,
            "significant": significant, "verdict": verdict(significant, alpha), **needed}


def compare_sampled(old: Sequence[Record], new: Sequence[Record], confidence: float, resamples: int, seed: int, what: str) -> dict[str, Any]:
    """avg@n and pass@k (k = 1..n) of `new` against `old`, from n samples per prompt: per metric
    the difference with a paired bootstrap interval over prompts; significant at 1 - confidence
    when the interval excludes 0."""
    pairs = align(old, new, what)
    n = min(len(r["samples"]) for pair in pairs for r in pair)
    hits = [([s["correct"] for s in o["samples"][:n]], [s["correct"] for s in m["samples"][:n]]) for o, m in pairs]
    alpha = level(confidence)
    out: dict[str, Any] = {"n": len(pairs), "samples": n}
    per_prompt = {f"avg@{n}": lambda c: float(np.mean(c)), **{f"pass@{k}": (lambda c, k=k: metrics.pass_at_k(n, int(sum(c)), k)) for k in range(1, n + 1)}}
    for name, f in per_prompt.items():
        a, b = [f(x) for x, _ in hits], [f(y) for _, y in hits]
        diff, lo, hi = paired_bootstrap(a, b, confidence, resamples, seed)
        significant = lo > 0 or hi < 0
        out[name] = {"old": float(np.mean(a)), "new": float(np.mean(b)), "difference": diff, "ci_low": lo, "ci_high": hi,
                     "significant": significant, "verdict": verdict(significant, alpha)}
    return out


def key(new: str, old: str) -> str:
    """A flat name for a comparison in metric keys and files: ('rl/main', 'sft') -> 'rl-main-vs-sft'."""
    return f"{new.replace('/', '-')}-vs-{old.replace('/', '-')}"
