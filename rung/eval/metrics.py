"""Evaluation metrics over sampled completions: pass@k, avg@n, maj@k, bootstrap intervals.

Pure functions on plain Python values (numpy only), so they can be tested without a model and
reused by any stage that has per-sample correctness.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np


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


def spectrum_ks(n: int) -> list[int]:
    """The k of the pass@k spectrum for n samples: every power of two up to n, and n itself."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    ks = [1 << i for i in range(n.bit_length())]
    return ks if ks[-1] == n else [*ks, n]


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


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """The most frequent answer after normalisation (strip), ignoring missing ones (None or
    blank); ties go to the answer that occurred first. None when no sample has an answer."""
    votes = Counter(a for a in map(_normalise, answers) if a is not None)
    if not votes:
        return None
    # Counter.most_common orders equal counts by first insertion, which is the tie rule we want.
    return votes.most_common(1)[0][0]


def maj_at_k(per_prompt_samples: Sequence[Sequence[tuple[str | None, bool]]], k: int) -> float:
    """maj@k: the fraction of prompts whose majority answer over their first k samples is correct.

    Each prompt gives its samples as (extracted answer, correct) pairs, in sampling order. The
    voted answer counts as correct when the first of the k samples that gave it was graded
    correct (the verifier is deterministic, so every sample with that answer has the same grade);
    a prompt where no sample has an answer counts as wrong.
    """
    if len(per_prompt_samples) == 0:
        raise ValueError("per_prompt_samples is empty")
    if k < 1:
        raise ValueError(f"k must be >= 1, got k={k}")
    hits = []
    for i, samples in enumerate(per_prompt_samples):
        if len(samples) < k:
            raise ValueError(f"k={k} but prompt {i} has only {len(samples)} samples")
        first_k = samples[:k]
        voted = majority_vote([a for a, _ in first_k])
        hits.append(voted is not None and next(ok for a, ok in first_k if _normalise(a) == voted))
    return float(np.mean(hits))


def check_bootstrap(confidence: float, resamples: int) -> None:
    """The settings every bootstrap here accepts."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")


def bootstrap_ci(
    values: Sequence[float], confidence: float = 0.95, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of values.

    Deterministic: the same values, confidence, resamples and seed give the same interval.
    """
    # scipy.stats.bootstrap would do this too, but this keeps the module numpy-only and the
    # interval fixed by our seed rather than by scipy's internal resampling order.
    if len(values) == 0:
        raise ValueError("values is empty")
    check_bootstrap(confidence, resamples)
    x = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, len(x), size=(resamples, len(x)))].mean(axis=1)
    alpha = (1 - confidence) / 2
    lo, hi = np.quantile(means, [alpha, 1 - alpha])
    return float(lo), float(hi)
