"""Calibration (issue #45): every interval and test the report and a study print, run on simulated
arms that do not differ, says "different" about as often as its level (5%) and not more.

Each check simulates 2000 replications of identical arms, at a small size (8 prompts, the committed
passk study's) and a medium one (40 prompts), and asserts that the false-alarm rate stays under 5%
plus a binomial margin: 2.576 standard errors of a 5% rate over 2000 replications (6.26%), which a
true rate of 8% would exceed with probability above 99%. The core (paired.intervals, paired.flip_test)
is vectorised over the replications; the end-to-end checks go through paired.sampled_test and
arms.arms_test with their records, to pin the units they build. Measured rates (seeded): see the
module's report in issue #45 and docs/evaluation.md.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, ttest_1samp, ttest_rel

from rung.eval import arms, metrics, paired
from tests.records import sampled

REPS = 2000
ALPHA = 0.05
UPPER = ALPHA + 2.576 * math.sqrt(ALPHA * (1 - ALPHA) / REPS)  # 0.0626
N, KS = 8, [1, 2, 4, 8]  # samples per prompt and the spectrum's k
TABLE = np.array([[metrics.pass_at_k(N, c, k) for k in KS] for c in range(N + 1)])  # pass@k of c right of N


def _difficulty(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Per-prompt solve rates, U-shaped like the demo's (many prompts nearly always or never solved)."""
    return rng.beta(0.6, 0.8, size=shape)


def _excludes_zero(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    return (low > 0) | (high < 0)


def mcnemar_size(discordant: int) -> float:
    """The exact McNemar test's false-alarm rate given `discordant` flips: under no difference each flip
    goes either way alike, so the binomial probability of the counts whose p is below the level (the two-sided
    binomial p at 1/2 is twice the smaller tail, as scipy's binomtest computes it)."""
    ups = np.arange(discordant + 1)
    p = np.minimum(1, 2 * binom.cdf(np.minimum(ups, discordant - ups), discordant, 0.5))
    return float(binom.pmf(ups, discordant, 0.5)[p < ALPHA].sum())


@pytest.mark.parametrize("prompts, flips", [(40, 0.15), (305, 0.05)])
def test_greedy_mcnemar_and_its_interval(prompts, flips):
    # two checkpoints that do not differ, where a prompt flips between them with chance `flips` (at most twice
    # its chance of the rarer outcome), either way alike: the 5-15% real checkpoints show (independent draws of
    # the two would flip about 29%). The exact test's own rate is known given the flips: the simulated rate
    # must sit near it, not only below the line
    rng = np.random.default_rng(prompts + int(100 * flips))
    p = _difficulty(rng, REPS, prompts)
    half = np.minimum(flips, 2 * np.minimum(p, 1 - p)) / 2
    u = rng.random((REPS, prompts))
    old, new = u < p, (u < p - half) | ((u >= p) & (u < p + half))
    tests = [paired.mcnemar(o, n) for o, n in zip(old, new, strict=True)]
    alarms = np.mean([t["mcnemar_p"] < ALPHA for t in tests])
    discordant = np.array([t["right_to_wrong"] + t["wrong_to_right"] for t in tests])
    expected = np.array([mcnemar_size(d) for d in range(discordant.max() + 1)])[discordant].mean()
    assert abs(alarms - expected) < 3 * math.sqrt(expected * (1 - expected) / REPS) and expected <= ALPHA
    intervals = [paired.mcnemar_interval(t["right_to_wrong"], t["wrong_to_right"], prompts) for t in tests]
    excluded = np.mean([lo > 0 or hi < 0 for _, lo, hi in intervals])
    assert excluded <= UPPER


@pytest.mark.parametrize("prompts", [8, 40])
def test_sampled_avg_pass_at_k_band_and_flip_test(prompts):
    rng = np.random.default_rng(100 + prompts)
    p = _difficulty(rng, REPS, prompts)
    old, new = TABLE[rng.binomial(N, p)], TABLE[rng.binomial(N, p)]  # (reps, prompts, k)
    diffs = np.moveaxis(new - old, -1, 1)  # (reps, k, prompts)
    ones = np.ones(prompts)
    _, low, high = paired.intervals(diffs[:, :1], ones, 0.95, 1000, 0)  # avg@n (pass@1) alone
    single_p, _ = paired.flip_test(diffs[:, :1], 1000, 0)
    _, band_low, band_high = paired.intervals(diffs, ones, 0.95, 1000, 0)  # the band over k
    family_p, _ = paired.flip_test(diffs, 1000, 0)
    rates = {
        "interval": _excludes_zero(low, high).mean(),
        "flip": (single_p < ALPHA).mean(),
        "band, any k": _excludes_zero(band_low, band_high).any(axis=1).mean(),
        "max-T flip, any k": (family_p < ALPHA).any(axis=1).mean(),
    }
    assert all(r <= UPPER for r in rates.values()), rates
    if prompts >= 40:  # not calibrated by being useless: near the level once the sample is not tiny
        assert all(r > 0.02 for r in rates.values()), rates


def test_avg_interval_sits_at_its_nominal_rate():
    # the avg@n interval at 40 prompts measured 5.95% over the 2000 replications above, near the line: here
    # 8000 (MC SE 0.24 points), checked both ways against its nominal 5% within 2.576 SE (0.63 points, so a
    # 3-point drift either way fails), and against what its widening targets, the paired t interval
    # (t_{m-1} sd / sqrt(m)), on the same replications: they decide alike (measured 5.09% and 4.73%, the two
    # disagreeing on 0.6% of replications)
    reps, prompts, rng = 8000, 40, np.random.default_rng(40)
    p = _difficulty(rng, reps, prompts)
    diffs = (TABLE[rng.binomial(N, p)] - TABLE[rng.binomial(N, p)])[..., 0]  # avg@n = pass@1 per prompt
    _, low, high = paired.intervals(diffs[:, None], np.ones(prompts), 0.95, 1000, 0)
    excluded = _excludes_zero(low, high)[:, 0]
    t = ttest_1samp(diffs, 0, axis=1).pvalue < ALPHA
    assert abs(excluded.mean() - ALPHA) <= 2.576 * math.sqrt(ALPHA * (1 - ALPHA) / reps), excluded.mean()
    assert (excluded != t).mean() < 0.02, (excluded.mean(), t.mean())


def _clustered(rng: np.random.Generator, shared: int, own: int, seeds: int, spread: float) -> tuple[dict, dict]:
    """Greedy outcomes {seed: {prompt id: 0/1}} of two arms over seeds that do not differ on average:
    each seed answers `shared` prompts and `own` of its own; on each prompt the new arm is better or
    worse by a prompt-level effect of sd `spread` in every seed alike (an arm x prompt interaction
    that averages to 0)."""
    ids = [f"s{i}" for i in range(shared)] + [f"{s}-{i}" for s in range(seeds) for i in range(own)]
    rate, effect = _difficulty(rng, len(ids)), rng.normal(0, spread, len(ids))
    rows = [list(range(shared)) + [shared + s * own + i for i in range(own)] for s in range(seeds)]
    old, new = {}, {}
    for s, r in enumerate(rows):
        old[s] = dict(zip((ids[i] for i in r), rng.random(len(r)) < np.clip(rate[r] - effect[r], 0, 1), strict=True))
        new[s] = dict(zip((ids[i] for i in r), rng.random(len(r)) < np.clip(rate[r] + effect[r], 0, 1), strict=True))
    return old, new


def _records(outcomes: dict) -> dict:
    return {
        s: [{"id": i, "samples": [{"correct": bool(c)}]} for i, c in by_id.items()] for s, by_id in outcomes.items()
    }


@pytest.mark.parametrize("shared, own", [(8, 0), (36, 4)])
def test_clustered_units_with_partly_overlapping_prompts(shared, own):
    # three seeds; with (36, 4) each seed also answers 4 prompts of its own: every prompt is one unit,
    # however many seeds answered it (counted once per seed, 26% of intervals excluded 0: issue #45)
    rng = np.random.default_rng(shared + own)
    runs = [_clustered(rng, shared, own, 3, 0.25) for _ in range(REPS)]
    one = arms.arms_test(*map(_records, runs[0]), 0.95, 400, 0, "sim")  # the units arms_test builds
    assert one.units == shared + 3 * own and one.rows == 3 * (shared + own)  # a prompt is one unit
    clusters = [[arms.unit_values(arm) for arm in run] for run in runs]
    diffs = np.array([new[0] - old[0] for old, new in clusters])[:, None]  # (reps, one metric, clusters)
    _, low, high = paired.intervals(diffs, clusters[0][0][1], 0.95, 1000, 0)
    p, _ = paired.flip_test(diffs, 1000, 0)
    rates = {"interval": _excludes_zero(low, high).mean(), "verdict": (p < ALPHA).mean()}
    assert all(r <= UPPER for r in rates.values()), rates


@pytest.mark.filterwarnings("ignore:Precision loss")  # seeds with equal accuracies: p = nan, no alarm
def test_seed_t_test():
    # the t-test over seeds (scipy's ttest_rel on the per-seed accuracies, as arms_test runs it) asks
    # whether the arm wins across training runs: arms that differ only by the runs' noise
    rng = np.random.default_rng(3)
    runs = [_clustered(rng, 40, 0, 3, 0.0) for _ in range(REPS)]
    means = np.array([[[np.mean(list(by_id.values())) for by_id in arm.values()] for arm in run] for run in runs])
    assert (ttest_rel(means[:, 1], means[:, 0], axis=1).pvalue < ALPHA).mean() <= UPPER
    u = arms.arm_units(*map(_records, runs[0]), "sim")
    assert np.allclose([u.seed_old, u.seed_new], means[0])  # the per-seed accuracies arms_test tests


def test_sampled_test_end_to_end_at_eight_prompts():
    # the report's table of sampled metrics at the committed study's size: no verdict and no band of the
    # family (avg@n and pass@k at every k) says "different" more often than the level; 500 replications
    # (margin 7.5%: this pins that sampled_test uses the calibrated core above; each k's own percentile
    # interval, as before issue #45, gave about 20% here)
    reps, rng = 500, np.random.default_rng(8)
    upper = ALPHA + 2.576 * math.sqrt(ALPHA * (1 - ALPHA) / reps)
    alarms = bands = 0
    for _ in range(reps):
        p = _difficulty(rng, 8)
        old, new = (sampled(list(rng.binomial(N, p)), N) for _ in range(2))
        s = paired.sampled_test(old, new, 0.95, 400, 0, "sim")
        alarms += any(m.significant for m in s.metrics.values())
        bands += any(m.ci_low > 0 or m.ci_high < 0 for m in s.metrics.values())
    assert alarms / reps <= upper and bands / reps <= upper
