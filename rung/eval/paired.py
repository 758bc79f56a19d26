"""Paired comparisons of two checkpoints that answered the same prompts.

Every checkpoint is evaluated on the same prompts, so the honest way to compare two is prompt by
prompt: the per-prompt differences carry the comparison, not the two accuracies and their separate
intervals. For greedy accuracy rung reports the difference with a paired percentile-bootstrap
interval, the prompts that flip each way, and the exact McNemar test (a two-sided binomial test
on the discordant prompts, from scipy); for avg@n and pass@k, which are per-prompt means over
samples, a paired bootstrap interval of the difference.

Plain functions on per-prompt values (numpy and scipy only), reusable by a seed study: the
bootstrap takes `strata` (e.g. the seed of each row) and then resamples prompts within each
stratum, so every resample keeps each seed's share of the rows. The tests of eval records
(`greedy_test`, `sampled_test`, and `arms_test` between two arms of a study over seeds) return
the typed results of rung.eval.results; rendering them is rung.report.tables' work.

Between two arms, on every eval set, `arms_test` takes the unit of resampling to be the prompt
when every seed answered the same prompts (a seed of RL alone), with its outcomes in all seeds
together, and the (seed, prompt) pair otherwise (the seed also changed the data); then
- the difference in greedy accuracy (new - old, over all seeds and prompts) with a paired
  bootstrap interval: units resampled, stratified by seed when the unit is a (seed, prompt) pair;
- an exact sign test over units (units where new does better against units where old does):
  with one seed it is the exact McNemar test of the report, and with shared prompts it does not
  count one prompt's seeds as independent evidence;
- the per-seed differences and a paired t-test over seeds (scipy.stats.ttest_rel), which asks
  whether the arm wins across training runs; with 2-3 seeds it has little power.
The prompt-level tests are conditional on the seeds run: they say whether these trained models
differ on this population of prompts; the spread over seeds is reported next to them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from statistics import mean
from typing import Any, NamedTuple

import numpy as np
from scipy.stats import binomtest, nct, norm, ttest_rel
from scipy.stats import t as t_dist

from rung.errors import InputError
from rung.eval import metrics
from rung.eval.results import ArmsTest, Boundary, EvalRecord, GreedyTest, MetricTest, SampledTest

Record = EvalRecord


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
    old: Sequence[float],
    new: Sequence[float],
    confidence: float = 0.95,
    resamples: int = 1000,
    seed: int = 0,
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
    d = b - a
    lo, hi = metrics.bootstrap_ci(d, confidence, resamples, seed, strata)
    return float(d.mean()), float(lo), float(hi)


def mcnemar(old: Sequence[bool], new: Sequence[bool]) -> dict[str, int | float]:
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


def mcnemar_prompts_needed(
    right_to_wrong: int, wrong_to_right: int, n: int, alpha: float = 0.05, power: float = 0.8
) -> int | None:
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


def _interval(
    old: Sequence[float],
    new: Sequence[float],
    confidence: float,
    resamples: int,
    seed: int,
    strata: Sequence[Any] | None = None,
) -> dict[str, float]:
    """paired_bootstrap's (difference, low, high) as the fields every test result carries them in."""
    diff, lo, hi = paired_bootstrap(old, new, confidence, resamples, seed, strata)
    return {"difference": diff, "ci_low": lo, "ci_high": hi}


def _judged(significant: bool, alpha: float, right_to_wrong: int, wrong_to_right: int, n: int) -> dict[str, Any]:
    """A greedy test's verdict fields; when not significant also prompts_needed: how many prompts
    would make this effect (these flips among n units) significant at 80% power."""
    out: dict[str, Any] = {"significant": significant, "verdict": verdict(significant, alpha)}
    if not significant:
        out["prompts_needed"] = mcnemar_prompts_needed(right_to_wrong, wrong_to_right, n, alpha)
    return out


def greedy_test(
    old: Sequence[Record], new: Sequence[Record], confidence: float, resamples: int, seed: int, what: str
) -> GreedyTest:
    """Greedy accuracy of `new` against `old` (records of one eval set, the first sample graded):
    difference with its paired bootstrap interval, flips each way, exact McNemar p and verdict."""
    pairs = align(old, new, what)
    a = [bool(o["samples"][0]["correct"]) for o, _ in pairs]
    b = [bool(n["samples"][0]["correct"]) for _, n in pairs]
    interval = _interval(a, b, confidence, resamples, seed)
    test = mcnemar(a, b)
    alpha = level(confidence)
    return GreedyTest(
        n=len(pairs),
        accuracy_old=float(np.mean(a)),
        accuracy_new=float(np.mean(b)),
        **interval,
        **test,
        **_judged(test["mcnemar_p"] < alpha, alpha, test["right_to_wrong"], test["wrong_to_right"], len(pairs)),
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
    (metrics.spectrum_ks): per metric the difference with a paired bootstrap interval over prompts;
    significant at 1 - confidence when the interval excludes 0. And the boundary: coverage (solved
    at least once in n) of each, the prompts only one of them solves, and the exact McNemar test of
    those counts."""
    pairs = align(old, new, what)
    n = metrics.common_n([r for pair in pairs for r in pair], what)
    hits = [([s["correct"] for s in o["samples"][:n]], [s["correct"] for s in m["samples"][:n]]) for o, m in pairs]
    alpha = level(confidence)
    out: dict[str, MetricTest] = {}
    per_prompt = {
        f"avg@{n}": lambda c: float(np.mean(c)),
        **{
            f"pass@{k}": (lambda c, k=k: metrics.pass_at_k(n, int(sum(c)), k))
            for k in metrics.spectrum_ks(n, compare_k)
        },
    }
    for name, f in per_prompt.items():
        a, b = [f(x) for x, _ in hits], [f(y) for _, y in hits]
        interval = _interval(a, b, confidence, resamples, seed)
        significant = interval["ci_low"] > 0 or interval["ci_high"] < 0
        out[name] = MetricTest(
            old=float(np.mean(a)),
            new=float(np.mean(b)),
            **interval,
            significant=significant,
            verdict=verdict(significant, alpha),
        )
    solved = [(any(x), any(y)) for x, y in hits]
    flips = mcnemar([a for a, _ in solved], [b for _, b in solved])
    boundary = Boundary(
        coverage_old=float(np.mean([a for a, _ in solved])),
        coverage_new=float(np.mean([b for _, b in solved])),
        solved_only_old=[o["id"] for (o, _), (a, b) in zip(pairs, solved, strict=True) if a and not b],
        solved_only_new=[o["id"] for (o, _), (a, b) in zip(pairs, solved, strict=True) if b and not a],
        mcnemar_p=flips["mcnemar_p"],
    )
    return SampledTest(n=len(pairs), samples=n, boundary=boundary, metrics=out)


def greedy_correct(record: Record) -> float:
    """A record's greedy outcome: True (1) when its first completion is graded correct. A bool, so that
    means over seeds keep the types the study files had (statistics.mean of bools can be an int)."""
    return bool(record["samples"][0]["correct"])


def pass_at(k: int) -> Callable[[Record], float]:
    """A record's pass@k from its n sampled completions (the unbiased estimator, rung.eval.metrics)."""

    def value(record: Record) -> float:
        hits = [s["correct"] for s in record["samples"]]
        return metrics.pass_at_k(len(hits), sum(hits), k)

    return value


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


def simultaneous_band(
    old: Sequence[np.ndarray],
    new: Sequence[np.ndarray],
    confidence: float,
    resamples: int,
    seed: int,
    strata: Sequence[Any] | None = None,
) -> list[tuple[float, float]]:
    """A paired bootstrap band of the differences new - old of several metrics on the same units
    (e.g. pass@k at every k of a claim) that covers all of them at once with probability
    `confidence`, so that a verdict read at every k keeps its family-wise level.

    Every metric is resampled with the same draws (metrics.bootstrap_means: one seed, one length);
    a resample's distance from the observed differences is its largest over the metrics of
    |resampled - observed| / bootstrap standard error (a max statistic), and the band is, at each
    metric, the observed difference ± the `confidence` quantile of that distance times its standard
    error: the sup-t band (Montiel Olea and Plagborg-Møller 2019). It reads the bulk of the
    resamples, not their extreme tails, so it holds its level with a thousand resamples. With one
    metric it is the percentile interval of paired_bootstrap. Written out: no library gives a
    simultaneous bootstrap band."""
    if len(old) != len(new) or not old:
        raise ValueError(f"need one or more metrics, old and new alike, got {len(old)} and {len(new)}")
    metrics.check_bootstrap(confidence, resamples)
    if len(old) == 1:  # no family: the interval itself
        return [paired_bootstrap(old[0], new[0], confidence, resamples, seed, strata)[1:]]
    diffs = [np.asarray(b, float) - np.asarray(a, float) for a, b in zip(old, new, strict=True)]
    observed = np.array([d.mean() for d in diffs])
    means = np.array([metrics.bootstrap_means(d, resamples, seed, strata) for d in diffs])  # (metrics, resamples)
    se = means.std(axis=1, ddof=1)
    # a metric that never varies (every unit the same difference) has no spread to reach: distance 0
    scaled = np.divide(np.abs(means - observed[:, None]), se[:, None], out=np.zeros_like(means), where=se[:, None] > 0)
    reach = float(np.quantile(scaled.max(axis=0), confidence))
    return [(float(d - reach * e), float(d + reach * e)) for d, e in zip(observed, se, strict=True)]


def unit_values(values: Mapping[int, Mapping[str, float]]) -> tuple[np.ndarray, list[int] | None]:
    """The units of a comparison over seeds from each seed's value per prompt id, and their strata:
    when every seed has the same prompts, a prompt with its value averaged over seeds (in the first
    seed's order; no strata); otherwise (the seed also changed the data) every (seed, prompt) pair,
    seed by seed, stratified by seed."""
    seeds = list(values)
    ids = list(values[seeds[0]])
    if all(values[s].keys() == values[seeds[0]].keys() for s in seeds):
        return np.array([[values[s][i] for i in ids] for s in seeds], dtype=float).mean(axis=0), None
    units = np.array([float(v) for s in seeds for v in values[s].values()])
    return units, [s for s in seeds for _ in values[s]]


class Units(NamedTuple):
    """Two arms' units on one eval set (unit_values) and their means per seed."""

    seeds: list[int]
    old: np.ndarray
    new: np.ndarray
    strata: list[int] | None
    seed_old: list[float]
    seed_new: list[float]


def arm_units(
    old: Mapping[int, Sequence[Record]],
    new: Mapping[int, Sequence[Record]],
    what: str,
    value: Callable[[Record], float] = greedy_correct,
) -> Units:
    """The paired units of arms `new` and `old` over the seeds both ran, each record scored by
    `value`; an InputError when they share no seed or a seed's two arms answered different prompts."""
    seeds = [s for s in old if s in new]
    if not seeds:
        raise InputError(f"{what}: no seed that both arms ran")
    pairs = {s: sorted(align(old[s], new[s], f"{what}, seed {s}"), key=lambda pair: pair[0]["id"]) for s in seeds}
    scored = [{s: {p[side]["id"]: value(p[side]) for p in pairs[s]} for s in seeds} for side in (0, 1)]
    (x_old, strata), (x_new, _) = unit_values(scored[0]), unit_values(scored[1])
    return Units(
        seeds,
        x_old,
        x_new,
        strata,
        [mean(scored[0][s].values()) for s in seeds],
        [mean(scored[1][s].values()) for s in seeds],
    )


def units_test(units: Units, confidence: float, resamples: int, seed: int) -> ArmsTest:
    """The tests of arm_units' units: see the module docstring for the interval and the tests."""
    x_old, x_new = units.old, units.new
    interval = _interval(x_old, x_new, confidence, resamples, seed, units.strata)
    up, down = int((x_new > x_old).sum()), int((x_new < x_old).sum())
    p = float(binomtest(up, up + down, 0.5).pvalue) if up + down else 1.0
    diffs = [n - o for n, o in zip(units.seed_new, units.seed_old, strict=True)]
    # the t-test needs differences that vary (scipy gives nan, with a warning, for identical ones)
    t_p = float(ttest_rel(units.seed_new, units.seed_old).pvalue) if len(set(diffs)) > 1 else None
    alpha = level(confidence)
    return ArmsTest(
        seeds=units.seeds,
        unit="prompt" if units.strata is None else "seed, prompt",
        units=len(x_old),
        accuracy_old=float(np.mean(units.seed_old)),
        accuracy_new=float(np.mean(units.seed_new)),
        **interval,
        units_better=up,
        units_worse=down,
        sign_test_p=p,
        per_seed_difference={str(s): d for s, d in zip(units.seeds, diffs, strict=True)},
        seed_t_test_p=t_p,
        **_judged(p < alpha, alpha, down, up, len(x_old)),
    )


def arms_test(
    old: Mapping[int, Sequence[Record]],
    new: Mapping[int, Sequence[Record]],
    confidence: float,
    resamples: int,
    seed: int,
    what: str,
    value: Callable[[Record], float] = greedy_correct,
) -> ArmsTest:
    """Arm `new` against arm `old` on one eval set, from their per-prompt records per seed (seeds
    both have): by default greedy accuracy, or any per-record `value` (e.g. pass_at(k) on sampled
    records); see the module docstring for the unit, interval and tests."""
    return units_test(arm_units(old, new, what, value), confidence, resamples, seed)


def key(new: str, old: str) -> str:
    """A flat name for a comparison in metric keys and files: ('rl/main', 'sft') -> 'rl-main-vs-sft'."""
    return f"{new.replace('/', '-')}-vs-{old.replace('/', '-')}"
