"""Held-out metrics of a learned reward: pairwise accuracy (the chosen completion scores higher), AUROC of the
score against the verifier's grade, overall and by difficulty bucket, and a PRM's step accuracy."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from scipy.stats import rankdata


def pairwise_accuracy(chosen: Sequence[float], rejected: Sequence[float]) -> float | None:
    """Share of pairs whose chosen completion scores higher, a tie counting one half; None without pairs."""
    if not chosen:
        return None
    wins = sum(1.0 if c > r else 0.5 if c == r else 0.0 for c, r in zip(chosen, rejected, strict=True))
    return wins / len(chosen)


def pairwise_accuracy_by_bucket(
    chosen: Sequence[float], rejected: Sequence[float], buckets: Sequence[str]
) -> dict[str, float]:
    """Pairwise accuracy within each difficulty bucket (a pair's: its prompt's)."""
    groups: dict[str, tuple[list[float], list[float]]] = defaultdict(lambda: ([], []))
    for c, r, b in zip(chosen, rejected, buckets, strict=True):
        groups[b][0].append(c)
        groups[b][1].append(r)
    return {b: pairwise_accuracy(c, r) or 0.0 for b, (c, r) in sorted(groups.items())}


def auroc(scores: Sequence[float], right: Sequence[bool]) -> float | None:
    """The probability that a right completion scores above a wrong one (ties one half): the Mann-Whitney U
    over the two counts' product, from mid-ranks. None when either class is empty (undefined)."""
    n_right = sum(right)
    n_wrong = len(right) - n_right
    if not n_right or not n_wrong:
        return None
    ranks = rankdata(scores)  # mid-ranks: a tie between a right and a wrong completion counts one half
    u = sum(r for r, y in zip(ranks, right, strict=True) if y) - n_right * (n_right + 1) / 2
    return float(u / (n_right * n_wrong))


def auroc_by_bucket(scores: Sequence[float], right: Sequence[bool], buckets: Sequence[str]) -> dict[str, float]:
    """AUROC within each difficulty bucket that holds both right and wrong completions."""
    groups: dict[str, tuple[list[float], list[bool]]] = defaultdict(lambda: ([], []))
    for s, y, b in zip(scores, right, buckets, strict=True):
        groups[b][0].append(s)
        groups[b][1].append(y)
    out = {b: auroc(s, y) for b, (s, y) in sorted(groups.items())}
    return {b: v for b, v in out.items() if v is not None}


def step_accuracy(scores: Sequence[float], labels: Sequence[float]) -> dict[str, float]:
    """A PRM's held-out steps: the share whose predicted probability (sigmoid of the score) falls on the same
    side of 1/2 as the Monte-Carlo label, the share a constant guess of the majority label gets (the chance
    level to beat), and the mean absolute error of the probability."""
    if not labels:
        return {}
    prob = [1 / (1 + math.exp(-s)) for s in scores]
    good = [p >= 0.5 for p in prob]
    truth = [y >= 0.5 for y in labels]
    share_good = sum(truth) / len(truth)
    return {
        "step_accuracy": sum(g == t for g, t in zip(good, truth, strict=True)) / len(truth),
        "majority_accuracy": max(share_good, 1 - share_good),
        "step_mae": sum(abs(p - y) for p, y in zip(prob, labels, strict=True)) / len(labels),
        "steps": float(len(labels)),
    }
