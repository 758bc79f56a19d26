"""Paired comparisons of two checkpoints that answered the same prompts.

Every checkpoint is evaluated on the same prompts, so the honest way to compare two is prompt by
prompt: the per-prompt differences carry the comparison, not the two accuracies and their separate
intervals. Plain functions on per-prompt values (numpy and scipy only), reusable by a seed study.

The unit is the prompt. In a study over seeds a prompt that several seeds answered is one cluster
(its rows in every seed together): resampled as one, flipped as one, counted once in "prompts
needed", whether all seeds answered the same prompts or the seed also changed the data (then some
clusters hold fewer rows). A difference is the mean over all (seed, prompt) rows, i.e. the sum of
the clusters' differences over their rows.

Which test gives each verdict (`test` of every result names it):
- greedy accuracy of two checkpoints: the exact McNemar test (a two-sided binomial test on the
  discordant prompts, scipy), exact at every number of prompts;
- everything else (avg@n, pass@k, arms of a study): the sign-flip permutation test over prompt
  clusters (`flip_test`): under no difference a cluster's difference is as likely to be negated,
  so its p is exact at every number of prompts: all 2^m sign patterns up to ENUMERATE clusters,
  else `resamples` random ones (p = (1 + hits) / (1 + resamples), exact in size too). Over a family
  of metrics (avg@n and pass@k at several k) the statistic is the largest standardised difference
  over the family (single-step max-T), so that the family's verdicts are wrong at most at the level.
  A bootstrap interval gives no verdict: the percentile bootstrap is too narrow with few prompts
  (10-12% false alarms at 8 prompts against 5%, tests/test_calibration.py).
- the interval of a greedy difference (`mcnemar_interval`): Bonett and Price's adjusted Wald interval
  from the flips, which holds its level near 0% and 100% and with few discordant prompts;
- the other intervals shown (`intervals`): the paired bootstrap over prompt clusters, widened for small
  samples (Hesterberg's expanded percentile interval, and the sup-t band over a family widened the
  same way), so that they too exclude 0 about as often as the level says.
- the verdict about a training procedure (arms of a study): a test over seeds, in rung.eval.arms.
A study corrects across its families (comparisons of arms x eval sets, once for the seed-level p and
once for the prompt-level p; claims x arms x eval sets) with Holm's step-down (`holm`;
rung.eval.arms.correct applies it); every printed p that carries a verdict is in one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
from scipy.stats import binom, binomtest, nct, norm
from scipy.stats import t as t_dist

from rung.errors import InputError
from rung.eval import metrics
from rung.eval.results import Boundary, EvalRecord, GreedyTest, MetricTest, SampledTest

Record = EvalRecord

MCNEMAR = "exact McNemar"
FLIP = "sign-flip permutation"
EXACT_POWER = 5000
"""Prompts up to which mcnemar_prompts_needed checks the exact test's power (cost grows with the prompts)."""
ENUMERATE = 12
"""Clusters up to which the sign-flip test enumerates all 2^m sign patterns (4096); above, random flips."""


def level(confidence: float) -> float:
    """The test level that matches a confidence: 0.95 -> 0.05 (rounded to hide float noise)."""
    return round(1 - confidence, 6)


def verdict(significant: bool, alpha: float, test: str) -> str:
    """The words every report uses, naming the test: 'significant at 0.05 (exact McNemar)'."""
    return f"{'significant' if significant else 'not significant'} at {alpha:g} ({test})"


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


def _counts(clusters: int, resamples: int, seed: int) -> np.ndarray:
    """(resamples, clusters): how often each cluster is drawn in each bootstrap resample, from the
    draws of metrics.bootstrap_means (one seed, one length: the same resamples everywhere)."""
    idx = metrics.bootstrap_indices(clusters, resamples, seed)
    offsets = clusters * np.arange(resamples)[:, None]
    return np.bincount((idx + offsets).ravel(), minlength=resamples * clusters).reshape(resamples, clusters)


def _widening(clusters: int, confidence: float) -> float:
    """How much wider than the bootstrap's a small sample's interval must be: t_{m-1} / z * sqrt(m / (m - 1))
    (the bootstrap's spread is the plug-in one, and its tails the normal's); inf below 2 clusters."""
    if clusters < 2:
        return float("inf")
    tail = 1 - (1 - confidence) / 2
    return float(t_dist.ppf(tail, clusters - 1) / norm.ppf(tail) * np.sqrt(clusters / (clusters - 1)))


def intervals(
    sums: np.ndarray,
    sizes: np.ndarray | Sequence[float],
    confidence: float,
    resamples: int,
    seed: int,
    bounds: tuple[float, float] = (-1.0, 1.0),
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(estimate, low, high) of each metric's mean over rows, from per-cluster sums `sums` of shape
    (..., metrics, clusters) over `sizes` rows per cluster: the bootstrap resamples clusters with
    replacement (the same draws for every metric and every leading index, so it vectorises).

    One metric: the expanded percentile interval (Hesterberg 2015, "What teachers should know about
    the bootstrap", section 6.5): the percentiles at the level whose normal quantile is the t quantile
    times sqrt(m / (m - 1)), which removes the percentile interval's narrowness with few clusters.
    Several metrics: the sup-t band (Montiel Olea and Plagborg-Moller 2019), the observed difference
    +- the `confidence` quantile of the largest |resampled - observed| / se over the metrics times
    each se, widened by the same factor: it covers all metrics at once. Either is cut to `bounds`, the
    values the metric can take (a difference of shares: -1..1; a share: 0..1), which the true value is in,
    so that cutting keeps the coverage. Written out: no library gives a clustered, widened or simultaneous
    bootstrap interval."""
    metrics.check_bootstrap(confidence, resamples)
    x, w = np.asarray(sums, dtype=float), np.asarray(sizes, dtype=float)
    if x.ndim < 2 or x.shape[-1] != len(w) or len(w) == 0:
        raise ValueError(f"sums must be (..., metrics, clusters) with {len(w)} clusters, got shape {x.shape}")
    c = _counts(len(w), resamples, seed)
    means = (x @ c.T) / (c @ w)  # (..., metrics, resamples)
    estimate = x.sum(axis=-1) / w.sum()
    widen = _widening(len(w), confidence)
    se = means.std(axis=-1, ddof=1)[..., None]
    # a metric that never varies (every cluster the same difference) has no spread to reach: distance 0
    scaled = np.divide(np.abs(means - estimate[..., None]), se, out=np.zeros_like(means), where=se > 0)
    reach = np.quantile(scaled.max(axis=-2), confidence, axis=-1)[..., None] * min(widen, 1e6)
    low, high = np.clip(estimate - reach * se[..., 0], *bounds), np.clip(estimate + reach * se[..., 0], *bounds)
    return estimate, low, high


def flip_test(sums: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, bool]:
    """Two-sided p of each metric's sum of cluster differences (shape (..., metrics, clusters)), by
    the sign-flip permutation test, single-step max-T over the metrics (so one metric's p is its own
    test's, several metrics' p hold family-wise); and whether every sign pattern was enumerated
    (clusters <= ENUMERATE) or `resamples` random ones drawn. The statistic |sum(e d)| / sqrt(sum(d^2))
    is per metric a monotone function of the paired t statistic. Written out: scipy's
    permutation_test has no max-T over several statistics and no vectorised batch."""
    d = np.asarray(sums, dtype=float)
    if d.ndim == 2:  # one comparison: a cluster without a difference in any metric changes no pattern's sum
        d = d[:, np.any(d != 0, axis=0)]
    m = d.shape[-1]
    exact = m <= ENUMERATE
    if exact:
        signs = 1.0 - 2 * ((np.arange(2**m)[:, None] >> np.arange(m)) & 1)
    else:
        signs = 1.0 - 2 * np.random.default_rng([seed, 45]).integers(0, 2, size=(resamples, m))
    scale = np.sqrt((d**2).sum(axis=-1))
    observed = np.divide(np.abs(d.sum(axis=-1)), scale, out=np.zeros_like(scale), where=scale > 0)
    flipped = np.divide(
        np.abs(d @ signs.T), scale[..., None], out=np.zeros(d.shape[:-1] + (len(signs),)), where=scale[..., None] > 0
    )
    top = flipped.max(axis=-2)  # (..., patterns): the family's largest statistic per pattern
    hits = (top[..., None, :] >= observed[..., None] * (1 - 1e-9)).sum(axis=-1)
    p = hits / len(signs) if exact else (1 + hits) / (1 + len(signs))
    return np.minimum(p, 1.0), exact


def flip_name(exact: bool, resamples: int) -> str:
    """The test's name with how its p was computed."""
    return f"{FLIP}, {'exact' if exact else f'{resamples} random flips'}"


def flip_floor(clusters: int, resamples: int) -> float:
    """The smallest p the sign-flip test can give on `clusters` clusters: 2 / 2^m when it enumerates
    (the observed pattern and its negation always reach the observed statistic), else 1 / (1 + resamples)."""
    return 2.0 / 2**clusters if clusters <= ENUMERATE else 1.0 / (1 + resamples)


def holm(p: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values of a family (compare each with the level: family-wise error at most the
    level). Written out: scipy has no Holm (statsmodels' multipletests is not a dependency)."""
    order = np.argsort(p, kind="stable")
    adjusted, running = np.empty(len(p)), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return [float(a) for a in adjusted]


def holm_factor(p: Sequence[float]) -> list[int]:
    """Each member's Holm multiplier (family size minus its rank among the p, smallest first)."""
    order = np.argsort(p, kind="stable")
    out = [0] * len(p)
    for rank, i in enumerate(order):
        out[i] = len(p) - rank
    return out


def mcnemar_interval(
    right_to_wrong: int, wrong_to_right: int, n: int, confidence: float = 0.95
) -> tuple[float, float, float]:
    """(difference, low, high) of two paired shares from their flips on n prompts: the difference
    (wrong_to_right - right_to_wrong) / n and Bonett and Price's (2012) adjusted Wald interval, which adds one
    to each discordant count and two to n ("Adjusted Wald confidence interval for a difference of binomial
    proportions based on paired data", J. Educ. Behav. Stat. 37(4)); it holds its level with few discordant
    prompts, near 0% and 100% and under a real effect, where a bootstrap of the per-prompt differences
    collapses (tests/test_calibration_intervals.py). Cut to [-1, 1]. Written out: scipy has no paired interval."""
    if n <= 0 or min(right_to_wrong, wrong_to_right) < 0 or right_to_wrong + wrong_to_right > n:
        raise ValueError(f"flips {right_to_wrong}, {wrong_to_right} do not fit {n} prompts")
    metrics.check_bootstrap(confidence, 1)
    worse, better = (right_to_wrong + 1) / (n + 2), (wrong_to_right + 1) / (n + 2)
    half = norm.ppf(1 - (1 - confidence) / 2) * np.sqrt((worse + better - (better - worse) ** 2) / (n + 2))
    centre = better - worse
    return (wrong_to_right - right_to_wrong) / n, max(centre - half, -1.0), min(centre + half, 1.0)


class McNemar(TypedDict):
    right_to_wrong: int
    wrong_to_right: int
    both_right: int
    both_wrong: int
    mcnemar_p: float


def mcnemar(old: Sequence[bool], new: Sequence[bool]) -> McNemar:
    """Exact McNemar test of paired right/wrong outcomes: of the prompts whose outcome differs,
    is 'wrong -> right' as likely as 'right -> wrong'? A two-sided binomial test (p = 0.5) on the
    discordant prompts (scipy.stats.binomtest); p = 1 when none differ."""
    if len(old) != len(new):
        raise ValueError(f"old and new differ in length: {len(old)} vs {len(new)}")
    a, b = np.asarray(old, dtype=bool), np.asarray(new, dtype=bool)
    right_to_wrong, wrong_to_right = int((a & ~b).sum()), int((~a & b).sum())
    discordant = right_to_wrong + wrong_to_right
    p = binomtest(wrong_to_right, discordant, 0.5).pvalue if discordant else 1.0
    return {
        "right_to_wrong": right_to_wrong,
        "wrong_to_right": wrong_to_right,
        "both_right": int((a & b).sum()),
        "both_wrong": int((~a & ~b).sum()),
        "mcnemar_p": float(p),
    }


def mcnemar_power(n: int, right_to_wrong: float, wrong_to_right: float, alpha: float) -> float:
    """Power of the exact McNemar test (two-sided binomial at 0.5 on the discordant prompts, as `mcnemar`)
    at `alpha` on n prompts whose flips each way have these rates: over the binomial number D of discordant
    prompts, the chance that the wrong -> right count falls where 2 * P(Binom(D, 0.5) <= min) < alpha."""
    d = np.arange(n + 1)
    discordant = right_to_wrong + wrong_to_right
    lower = binom.ppf(alpha / 2, d, 0.5) - 1  # the largest count of the rarer flip that rejects (-1: none)
    q = wrong_to_right / discordant
    reject = binom.cdf(lower, d, q) + binom.sf(d - lower - 1, d, q)
    return float(binom.pmf(d, n, discordant) @ reject)


def mcnemar_prompts_needed(
    right_to_wrong: int, wrong_to_right: int, n: int, alpha: float = 0.05, power: float = 0.8
) -> int | None:
    """Prompts a paired comparison needs for a two-sided McNemar test at `alpha` to detect, with
    probability `power`, the effect that these flips show (their rates on n prompts taken as the
    truth: a post-hoc figure, a function of the observed effect). Connor's (1987) normal-approximation
    n = (z_{1-alpha/2} sqrt(psi) + z_power sqrt(psi - delta^2))^2 / delta^2 (psi = (b + c) / n the
    discordance, delta = (c - b) / n the effect) falls a little short for the exact test (at 12 flips
    against 5 on 95 prompts, 257 prompts give it 77%: tests/test_calibration_studies.py), so from there
    the prompts step up until the exact test's power (`mcnemar_power`) reaches `power`; above
    EXACT_POWER prompts the approximation is kept. Written out because statsmodels has no McNemar power
    (its contingency_tables only test). None when the flips balance: no number of prompts detects an
    effect of zero."""
    if n <= 0 or min(right_to_wrong, wrong_to_right) < 0 or right_to_wrong + wrong_to_right > n:
        raise ValueError(f"flips {right_to_wrong}, {wrong_to_right} do not fit {n} prompts")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"alpha and power must be in (0, 1), got {alpha}, {power}")
    psi, delta = (right_to_wrong + wrong_to_right) / n, (wrong_to_right - right_to_wrong) / n
    if delta == 0:
        return None
    root = norm.ppf(1 - alpha / 2) * np.sqrt(psi) + norm.ppf(power) * np.sqrt(psi - delta**2)
    needed = int(np.ceil(root**2 / delta**2))
    if needed > EXACT_POWER:
        return needed
    while mcnemar_power(needed, right_to_wrong / n, wrong_to_right / n, alpha) < power:
        needed += 1
    return needed


def judged(
    significant: bool,
    alpha: float,
    test: str,
    right_to_wrong: int,
    wrong_to_right: int,
    n: int,
    plan: float | None = None,
) -> dict[str, Any]:
    """A test's verdict fields; when not significant also prompts_needed: how many prompts (clusters)
    would make this effect (these flips among n units) significant at `plan` (default `alpha`) with
    80% power (post-hoc: from the observed effect)."""
    out: dict[str, Any] = {"significant": significant, "verdict": verdict(significant, alpha, test)}
    if not significant:
        out["prompts_needed"] = mcnemar_prompts_needed(right_to_wrong, wrong_to_right, n, plan or alpha)
    return out


def greedy_test(old: Sequence[Record], new: Sequence[Record], confidence: float, what: str) -> GreedyTest:
    """Greedy accuracy of `new` against `old` (records of one eval set, the first sample graded):
    difference with its paired interval (mcnemar_interval), flips each way, exact McNemar p and verdict."""
    return _outcome_test(old, new, confidence, what, lambda s: bool(s["correct"]))


def first_answer_test(old: Sequence[Record], new: Sequence[Record], confidence: float, what: str) -> GreedyTest:
    """As greedy_test on the greedy episodes' FIRST answers (`episode["first_correct"]`: retry's first turn, the
    single-turn answer): whether training moved what the model answers before any feedback."""
    return _outcome_test(old, new, confidence, what, lambda s: bool(s["episode"]["first_correct"]))


def _outcome_test(
    old: Sequence[Record],
    new: Sequence[Record],
    confidence: float,
    what: str,
    outcome: Callable[[Mapping[str, Any]], bool],
) -> GreedyTest:
    """A paired right/wrong outcome of each record's first sample: difference with its paired interval, flips
    each way, exact McNemar p and verdict."""
    pairs = align(old, new, what)
    return outcome_test(
        [outcome(o["samples"][0]) for o, _ in pairs], [outcome(n["samples"][0]) for _, n in pairs], confidence
    )


def outcome_test(a: Sequence[bool], b: Sequence[bool], confidence: float) -> GreedyTest:
    """Paired right/wrong outcomes `b` (new) against `a` (old), one per prompt: difference with its paired interval
    (mcnemar_interval), flips each way, exact McNemar p and verdict."""
    test = mcnemar(a, b)
    diff, lo, hi = mcnemar_interval(test["right_to_wrong"], test["wrong_to_right"], len(a), confidence)
    alpha = level(confidence)
    return GreedyTest(
        n=len(a),
        accuracy_old=float(np.mean(a)),
        accuracy_new=float(np.mean(b)),
        difference=diff,
        ci_low=lo,
        ci_high=hi,
        **test,
        test=MCNEMAR,
        **judged(test["mcnemar_p"] < alpha, alpha, MCNEMAR, test["right_to_wrong"], test["wrong_to_right"], len(a)),
    )


def sampled_test(
    old: Sequence[Record],
    new: Sequence[Record],
    confidence: float,
    resamples: int,
    seed: int,
    what: str,
    compare_k: Sequence[int] = (),
) -> SampledTest:
    """avg@n and pass@k of `new` against `old`, from n samples per prompt (the smallest count, with
    a warning when some prompt has more), at the k of the spectrum and `compare_k`
    (metrics.spectrum_ks). These metrics are one family: per metric the difference with the sup-t
    band over the family (`intervals`) and the sign-flip test's max-T p over the family (`flip_test`),
    significant when p < 1 - confidence, so that a verdict read at every k keeps the level. And the
    boundary: coverage (solved at least once in n) of each, the prompts only one of them solves, and
    the exact McNemar test of those counts."""
    pairs = align(old, new, what)
    n = metrics.common_n([r for pair in pairs for r in pair], what)
    hits = [([s["correct"] for s in o["samples"][:n]], [s["correct"] for s in m["samples"][:n]]) for o, m in pairs]
    alpha = level(confidence)

    def pass_at(k: int, correct: list[bool]) -> float:
        return metrics.pass_at_k(n, int(sum(correct)), k)

    per_prompt: dict[str, Callable[[list[bool]], float]] = {
        f"avg@{n}": lambda c: float(np.mean(c)),
        **{f"pass@{k}": functools.partial(pass_at, k) for k in metrics.spectrum_ks(n, compare_k)},
    }
    values = np.array([[[f(x), f(y)] for x, y in hits] for f in per_prompt.values()])  # (metric, prompt, old/new)
    diffs = values[..., 1] - values[..., 0]
    est, low, high = intervals(diffs, np.ones(len(pairs)), confidence, resamples, seed)
    p, exact = flip_test(diffs, resamples, seed)
    test = flip_name(exact, resamples)
    out = {
        name: MetricTest(
            old=float(values[i, :, 0].mean()),
            new=float(values[i, :, 1].mean()),
            difference=float(est[i]),
            ci_low=float(low[i]),
            ci_high=float(high[i]),
            p=float(p[i]),
            significant=bool(p[i] < alpha),
            verdict=verdict(bool(p[i] < alpha), alpha, test),
        )
        for i, name in enumerate(per_prompt)
    }
    solved = [(any(x), any(y)) for x, y in hits]
    flips = mcnemar([a for a, _ in solved], [b for _, b in solved])
    boundary = Boundary(
        coverage_old=float(np.mean([a for a, _ in solved])),
        coverage_new=float(np.mean([b for _, b in solved])),
        solved_only_old=[o["id"] for (o, _), (a, b) in zip(pairs, solved, strict=True) if a and not b],
        solved_only_new=[o["id"] for (o, _), (a, b) in zip(pairs, solved, strict=True) if b and not a],
        mcnemar_p=flips["mcnemar_p"],
    )
    return SampledTest(n=len(pairs), samples=n, family=list(out), test=test, boundary=boundary, metrics=out)


def t_test_power(n: int | np.ndarray, effect: float, sd: float, alpha: float = 0.05) -> np.ndarray:
    """Power of a two-sided one-sample (paired) t-test at `alpha` on n units whose differences have
    mean `effect` and standard deviation `sd`: the noncentral t with n - 1 degrees of freedom and
    noncentrality effect / sd * sqrt(n) (scipy.stats.nct); n may be an array of sizes."""
    df = np.asarray(n) - 1
    crit, nc = t_dist.ppf(1 - alpha / 2, df), abs(effect) / sd * np.sqrt(df + 1)
    return nct.sf(crit, df, nc) + nct.cdf(-crit, df, nc)


def units_needed(sd: float, effect: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Paired units (prompts, or seeds) a two-sided paired t-test of a mean difference at `alpha`
    needs to detect `effect` with probability `power` when the per-unit differences have standard
    deviation `sd`: the smallest n >= 2 whose power by the noncentral t reaches `power`
    (t_test_power). With few units the t distribution matters: at n = 2 (df = 1) power is far below
    what the normal approximation promises. The search starts at the normal approximation
    ((z_{1-alpha/2} + z_power) sd / effect)^2, which never overshoots, and steps up; written out
    because scipy has no power solver (statsmodels, which has one, is not a dependency). None for
    effect 0, and for sd 0 (differences that never vary give no spread to plan from)."""
    if sd < 0 or not (0 < alpha < 1 and 0 < power < 1):
        raise ValueError(f"need sd >= 0 and alpha, power in (0, 1), got {sd}, {alpha}, {power}")
    if abs(effect) < 1e-9 or sd == 0:  # a difference of rounding noise is no effect
        return None
    n = max(2, int(np.ceil(((norm.ppf(1 - alpha / 2) + norm.ppf(power)) * sd / abs(effect)) ** 2)))
    while True:  # the t test needs a few units more than the normal approximation: look 8 at a time
        ns = np.arange(n, n + 8)
        enough = np.flatnonzero(t_test_power(ns, effect, sd, alpha) >= power)
        if len(enough):
            return int(ns[enough[0]])
        n += 8


def key(new: str, old: str) -> str:
    """A flat name for a comparison in metric keys and files: ('rl/main', 'sft') -> 'rl-main-vs-sft'."""
    return f"{new.replace('/', '-')}-vs-{old.replace('/', '-')}"
