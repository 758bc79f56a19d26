"""Evaluation metrics over sampled completions: pass@k, avg@n, maj@k, and their intervals.

Pure functions on plain Python values (numpy and scipy only), so they can be tested without a model and
reused by any stage that has per-sample correctness.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import beta

log = logging.getLogger(__name__)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples, drawn without replacement from n of which c
    are correct, is correct: the unbiased pass@k estimator, 1 - C(n-c, k) / C(n, k).

    Chen et al. 2021, "Evaluating Large Language Models Trained on Code" (the Codex paper,
    arXiv:2107.03374), section 2.1 and figure 3: the ratio of binomials is evaluated as the
    product prod_{i=n-c+1}^{n} (1 - k/i), which never forms the binomials themselves, so it
    neither overflows (C(2000, 500) is ~1e486) nor loses precision for large n.
    """
    if not 1 <= k <= n:
        raise ValueError(f"k must satisfy 1 <= k <= n (n={n}), got k={k}")
    if not 0 <= c <= n:
        raise ValueError(f"c must satisfy 0 <= c <= n (n={n}), got c={c}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(correct_counts: Sequence[int], n: int, k: int) -> float:
    """pass@k averaged over prompts, each with n samples of which correct_counts[i] are correct."""
    if len(correct_counts) == 0:
        raise ValueError("correct_counts is empty")
    return float(np.mean([pass_at_k(n, c, k) for c in correct_counts]))


def spectrum_ks(n: int, also: Sequence[int] = ()) -> list[int]:
    """The k of the pass@k spectrum for n samples: every power of two up to n, n itself, and the k of
    `also` (e.g. eval.samples.compare_k) up to n, in order."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return sorted({*(1 << i for i in range(n.bit_length())), n, *(k for k in also if 1 <= k <= n)})


def common_n(records: Sequence[Mapping[str, Any]], what: str) -> int:
    """The samples every record has (the smallest count), with a warning naming the counts when some
    record has more: its extra samples are left out, so that every prompt is scored at one n."""
    counts = [len(r["samples"]) for r in records]
    n = min(counts)
    more = sum(c > n for c in counts)
    if more:
        log.warning(
            "%s: %d of %d prompts have more than %d samples (up to %d); every prompt is cut to its first %d",
            what,
            more,
            len(counts),
            n,
            max(counts),
            n,
        )
    return n


def coverage(correct_counts: Sequence[int]) -> float:
    """The share of prompts solved at least once among their samples (pass@n for n samples):
    the boundary of what the model can solve at all, at this budget."""
    if len(correct_counts) == 0:
        raise ValueError("correct_counts is empty")
    return float(np.mean([c > 0 for c in correct_counts]))


def avg_at_n(per_prompt_correct: Sequence[Sequence[bool]]) -> float:
    """avg@n: the fraction of correct samples per prompt (pass@1 estimated from n samples),
    averaged over prompts, so every prompt weighs the same whatever its number of samples."""
    if len(per_prompt_correct) == 0:
        raise ValueError("per_prompt_correct is empty")
    if any(len(s) == 0 for s in per_prompt_correct):
        raise ValueError("per_prompt_correct: every prompt needs at least one sample")
    return float(np.mean([np.mean(s) for s in per_prompt_correct]))


def _normalise(answer: str | None) -> str | None:
    """The form answers are compared in: surrounding whitespace stripped; empty means no answer."""
    if answer is None:
        return None
    return answer.strip() or None


Classify = Callable[[str], Hashable]
"""An answer's class under its prompt's grader: answers of one class are one answer to the vote
(rung.answers.verify.answer_class). Called once per distinct answer, in sampling order."""

_RIGHT = object()
"""The class of every answer graded right (each is equal to the reference)."""


def votes_right(
    samples: Sequence[tuple[str | None, bool]],
    ks: Sequence[int],
    classify: Classify | None,
    weights: Sequence[float] | None = None,
) -> list[bool]:
    """For each k of ks (ascending): whether the majority answer among the first k samples is right.

    Answers are counted by class: every sample graded correct is one class, a wrong answer's class is
    `classify` of it (or, without, the stripped string); a sample counts 1, or its weight of `weights`
    (weighted majority: rung.eval.rerank); ties go to the class that occurred first. One
    pass over the samples for all k, each distinct answer classified once: no answer is compared with
    the others, so the grader's cost grows with n, not with n times the distinct answers. Written out:
    no library votes over a grader's classes."""
    counts: dict[Hashable, float] = defaultdict(float)  # class -> votes (or weights) so far
    first: dict[Hashable, int] = {}  # class -> index of its first vote (the tie rule)
    classes: dict[str, Hashable] = {}  # answer string -> class
    # without a right sample the majority cannot be right, and with no wrong one it cannot be wrong:
    # the grader is asked only when both occur
    ask = classify if any(ok for _, ok in samples) and not all(ok for _, ok in samples) else None
    out, todo = [], iter(ks)
    k = next(todo, None)
    for i, (answer, ok) in enumerate(samples, start=1):
        a = _normalise(answer)
        if a is not None:
            if ok:
                c = _RIGHT
            else:
                if a not in classes:
                    classes[a] = ask(a) if ask is not None else a
                c = classes[a]
            counts[c] += 1 if weights is None else weights[i - 1]
            first.setdefault(c, i)
        while k == i:
            top = max(counts.values(), default=0)
            winner = min((c for c, v in counts.items() if v == top), key=first.__getitem__) if top else None
            out.append(winner is _RIGHT)
            k = next(todo, None)
    return out


def maj_at_ks(
    per_prompt_samples: Sequence[Sequence[tuple[str | None, bool]]],
    ks: Sequence[int],
    classes: Sequence[Classify] | None = None,
) -> dict[int, float]:
    """maj@k at each k of ks: the fraction of prompts whose majority answer over their first k
    samples is right.

    Each prompt gives its samples as (extracted answer, correct) pairs, in sampling order, and,
    with `classes`, the function that gives each of its answers its class under the grader: "5", "5.0"
    and "5.00" are one answer to a grader that calls them equal. Every right answer is one (each is
    equal to the reference); without `classes`, wrong answers are compared as stripped strings. A
    prompt where no sample has an answer counts as wrong."""
    if len(per_prompt_samples) == 0:
        raise ValueError("per_prompt_samples is empty")
    if classes is not None and len(classes) != len(per_prompt_samples):
        raise ValueError(f"classes has {len(classes)} graders for {len(per_prompt_samples)} prompts")
    ks = sorted(set(ks))
    if not ks or ks[0] < 1:
        raise ValueError(f"every k must be >= 1, got {ks}")
    for i, samples in enumerate(per_prompt_samples):
        if len(samples) < ks[-1]:
            raise ValueError(f"k={ks[-1]} but prompt {i} has only {len(samples)} samples")
    right = np.array(
        [
            votes_right(samples[: ks[-1]], ks, classes[i] if classes is not None else None)
            for i, samples in enumerate(per_prompt_samples)
        ]
    )
    return {k: float(v) for k, v in zip(ks, right.mean(axis=0), strict=True)}


def maj_at_k(
    per_prompt_samples: Sequence[Sequence[tuple[str | None, bool]]], k: int, classes: Sequence[Classify] | None = None
) -> float:
    """maj@k at one k (maj_at_ks)."""
    return maj_at_ks(per_prompt_samples, [k], classes)[k]


def check_bootstrap(confidence: float, resamples: int) -> None:
    """The settings every bootstrap here accepts."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")


def bootstrap_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, n) indices of `resamples` bootstrap resamples of n values, with replacement. The
    draws depend only on the seed and n, so values of one length get the same resamples (a band over
    several k, a paired interval of clusters, rung.eval.paired, read them together)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def bootstrap_means(values: Sequence[float] | np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """The means of `resamples` bootstrap resamples of values (bootstrap_indices)."""
    x = np.asarray(values, dtype=float)
    return x[bootstrap_indices(len(x), resamples, seed)].mean(axis=1)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of values (bootstrap_means).

    Deterministic: the same values, confidence, resamples and seed give the same interval.
    """
    # scipy.stats.bootstrap would do this too, but this keeps the module numpy-only and the
    # interval fixed by our seed rather than by scipy's internal resampling order.
    if len(values) == 0:
        raise ValueError("values is empty")
    check_bootstrap(confidence, resamples)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(bootstrap_means(values, resamples, seed), [alpha, 1 - alpha])
    return float(lo), float(hi)


def share_interval(
    values: ArrayLike, confidence: float = 0.95, weights: Sequence[float] | np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Confidence interval of the mean of values in [0, 1] over their last axis (a share of right answers, the
    mean of per-prompt pass@k, a study's prompt clusters with `weights` rows each), vectorised over leading axes.

    For 0/1 values it is the Clopper-Pearson (exact binomial) interval, whose coverage is at least `confidence`
    at every true share and size, 0% and 100% included. For other values it is Clopper-Pearson at an effective
    number of prompts, n / rho: rho is the variance of the least favourable distribution at each bound (the
    observed values with mass moved to the far end, 0 for the low bound, 1 for the high: a prompt the sample
    missed) over bound * (1 - bound); for 0/1 values rho = 1. The far-end mass is what keeps the interval
    honest near 0% and 100%, where the mean of pass@k is set by a few hard prompts a sample often lacks; with
    equal weights n is the number of values, else Kish's effective number (sum w)^2 / sum w^2. Coverage
    measured in tests/test_calibration_intervals.py and docs/evaluation.md; written out because no library
    gives an interval for the mean of bounded values that holds at the boundary."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x = np.asarray(values, dtype=float)
    w = np.ones(x.shape[-1]) if weights is None else np.asarray(weights, dtype=float)
    if x.shape[-1] == 0 or w.shape != x.shape[-1:] or np.any(w <= 0):
        raise ValueError(f"need values (..., n) with n >= 1 and n positive weights, got {x.shape} and {w.shape}")
    if np.any((x < 0) | (x > 1)):
        raise ValueError("share_interval: values must lie in [0, 1]")
    mean = x @ w / w.sum()
    spread = (x - mean[..., None]) ** 2 @ w / w.sum()
    n, tail = w.sum() ** 2 / (w**2).sum(), (1 - confidence) / 2
    return _low_bound(mean, spread, n, tail), 1 - _low_bound(1 - mean, spread, n, tail)


def _low_bound(mean: np.ndarray, spread: np.ndarray, n: float, tail: float) -> np.ndarray:
    """share_interval's low bound: the largest L with L = Clopper-Pearson's low bound of `mean` at n / rho(L),
    found by iterating from L = mean (each step lowers L; the steps shrink fast, 8 give 1e-5)."""
    bound = mean.copy()
    for _ in range(100):
        far = np.divide(mean - bound, mean, out=np.zeros_like(mean), where=mean > 0)  # the mass moved to 0
        variance = (1 - far) * spread + far * (1 - far) * mean**2
        rho = np.divide(variance, bound * (1 - bound), out=np.ones_like(mean), where=(bound > 0) & (bound < 1))
        size = n / np.clip(rho, 1e-12, 1)
        hits = mean * size
        new = np.where(mean > 0, beta.ppf(tail, np.maximum(hits, 1e-300), size - hits + 1), 0.0)
        if np.all(np.abs(new - bound) < 1e-9):
            return new
        bound = new
    return bound
