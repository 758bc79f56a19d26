"""Calibration of a study's verdicts and of its planning figures: simulated studies whose arms do not
differ say "different" at most as often as the level, with the whole family held to it; and a study
run at the size a planning figure names reaches the power it states.

The studies are the curriculum study's shape (3 arms x 5 seeds, 305 held-out prompts and 50 out of
domain) with checkpoints that vary from run to run: each (arm, seed) checkpoint's accuracy is shifted
by a normal run effect (logit scale) whose sd is 1 or 2 points of accuracy, and its greedy outcome on a
prompt follows the prompt's difficulty through a Gaussian copula whose prompt part (rho 0.9) is shared
by every checkpoint (RL runs from one SFT checkpoint answer mostly alike: ~30 of 305 prompts differ
between two arms, as in the curriculum study). Rates over 2000 replications (MC SE 0.49 points at 5%),
checked against 5% + 2.576 SE (6.26%), which a 3-point drift (8%) exceeds with probability > 99%; power
over 4000 (SE 0.63 points at 80%). Vectorised numpy, shared simulations (functools.cache).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest
from numpy.polynomial.hermite_e import hermegauss
from scipy.special import expit
from scipy.stats import binom, norm, ttest_1samp, ttest_rel

from rung.eval import arms, paired
from rung.report import spectrum
from tests.test_calibration import ALPHA, REPS, UPPER

ARMS, SEEDS, SETS, RHO = 3, 5, (305, 50), 0.9
PAIRS = [(j, i) for j in range(ARMS) for i in range(j)]  # (new, old): each later arm against each earlier one
POWER_REPS = 4000
MARGIN = 0.02  # the study's default non-inferiority margin
POWER_TOL = 2.576 * math.sqrt(0.8 * 0.2 / POWER_REPS)  # 1.6 points


@cache
def _study(spread: float) -> list[np.ndarray]:
    """Per eval set, greedy outcomes (reps, arms, seeds, prompts) of arms that do not differ, whose
    checkpoints vary from run to run by `spread` (sd of a checkpoint's accuracy)."""
    rng = np.random.default_rng(round(1000 * spread))
    shift_unit = rng.normal(0, 1, (REPS, ARMS, SEEDS, 1))  # one run effect per checkpoint, on every set
    out = []
    for prompts in SETS:
        difficulty = rng.normal(0, 2, (REPS, 1, 1, prompts))
        slope = float((expit(difficulty) * (1 - expit(difficulty))).mean())  # d accuracy / d logit
        right = expit(difficulty + shift_unit * spread / slope)
        z = np.sqrt(RHO) * rng.standard_normal((REPS, 1, 1, prompts))
        z = z + np.sqrt(1 - RHO) * rng.standard_normal((REPS, ARMS, SEEDS, prompts))
        out.append(norm.cdf(z) < right)
    return out


def _seed_p(outcomes: np.ndarray, new: int, old: int) -> np.ndarray:
    """The procedure's p per replication: the paired t-test over seeds of the two arms' accuracies."""
    acc = outcomes.mean(axis=-1)
    return ttest_rel(acc[:, new], acc[:, old], axis=1).pvalue


def _prompt_p(outcomes: np.ndarray, new: int, old: int) -> np.ndarray:
    """The sign-flip p over prompt clusters (each prompt's rows in every seed), as arms_test runs it."""
    d = (outcomes[:, new].astype(float) - outcomes[:, old]).sum(axis=1)[:, None]  # (reps, one metric, prompts)
    return paired.flip_test(d, 1000, 0)[0][:, 0]


def _records(outcomes: np.ndarray) -> dict[int, list[dict]]:
    return {
        s: [{"id": f"p{i}", "samples": [{"correct": bool(c)}]} for i, c in enumerate(row)]
        for s, row in enumerate(outcomes)
    }


@pytest.mark.parametrize("spread", [0.01, 0.02])
def test_run_to_run_variation_the_seed_level_verdict_holds_its_level(spread):
    test = _study(spread)[0]
    seed_p, prompt_p = _seed_p(test, 1, 0), _prompt_p(test, 1, 0)
    rates = {"seed level": (seed_p < ALPHA).mean(), "prompt level": (prompt_p < ALPHA).mean()}
    assert rates["seed level"] <= UPPER, rates
    # the test over prompts holds the checkpoints fixed: about a rerun of the procedure it is wrong far more
    # often than the level (measured 11.0% at 1 point, 27.2% at 2; the seed level 5.1% and 4.9%): it is
    # printed as about these checkpoints
    assert rates["prompt level"] > UPPER, rates
    # the simulation's test is what a study runs: arms_test's procedure p on one replication's records
    r = arms.arms_test(_records(test[0, 0]), _records(test[0, 1]), 0.95, 200, 0, "sim")
    assert r.procedure.p == pytest.approx(seed_p[0]) and r.units == SETS[0]


@pytest.mark.filterwarnings("ignore:Precision loss")  # seeds with equal accuracies: p = nan, no alarm
def test_holm_holds_the_study_family_of_pairs_x_eval_sets():
    # 3 arms x 2 eval sets: 6 correlated t-tests over seeds (pairs share arms, sets share checkpoints)
    p = np.stack([_seed_p(outcomes, new, old) for outcomes in _study(0.01) for new, old in PAIRS], axis=1)
    any_raw = (p < ALPHA).any(axis=1).mean()
    any_holm = np.mean([min(paired.holm(list(row))) < ALPHA for row in p])
    assert any_holm <= UPPER < any_raw, (any_holm, any_raw)  # each alone at 0.05: 23.7% any-of-six; Holm 3.6%


def test_first_and_final_answer_mcnemar_one_family():
    # an episode checkpoint against its single-turn control on one set: the first answer and the final
    # answer (right more often, after feedback) of the same prompts, two arms that do not differ
    rng = np.random.default_rng(6)
    prompts = 60
    rate = rng.beta(0.6, 0.8, (REPS, 1, prompts))
    first = rng.random((REPS, 2, prompts)) < rate
    final = first | (rng.random((REPS, 2, prompts)) < 0.3)  # feedback fixes some wrong first answers
    flips = [np.stack([(a[:, 0] & ~a[:, 1]).sum(-1), (~a[:, 0] & a[:, 1]).sum(-1)], axis=1) for a in (first, final)]
    p = np.stack([_mcnemar_p(f) for f in flips], axis=1)  # (reps, first / final)
    assert p[0, 1] == pytest.approx(paired.mcnemar(final[0, 0], final[0, 1])["mcnemar_p"])
    # (each alone is exact and here conservative: any of the two measured 4.4% uncorrected, 3.4% with Holm)
    assert np.mean([min(paired.holm(list(row))) < ALPHA for row in p]) <= UPPER


def _power_t(n: int, effect: float, sd: float, alpha: float, rng: np.random.Generator) -> float:
    d = rng.normal(effect, sd, (POWER_REPS, n))
    return float((ttest_rel(d, np.zeros_like(d), axis=1).pvalue < alpha).mean())


@pytest.mark.parametrize("sd, effect, members", [(0.022, 0.02, 6), (0.1, 0.05, 18)])
def test_seeds_and_prompts_needed_reach_the_stated_power(sd, effect, members):
    # units_needed plans seeds (sd of per-seed differences: the curriculum study's, 2 points at Holm's
    # strictest level over 6) and prompts (a claim's per-prompt sd at 18 members); simulated at the
    # planned size the t-test reaches 80%, and one unit fewer does not
    rng = np.random.default_rng(7)
    alpha = ALPHA / members
    n = paired.units_needed(sd, effect, alpha)
    assert n is not None
    assert _power_t(n, effect, sd, alpha, rng) >= 0.8 - POWER_TOL
    assert _power_t(n - 1, effect, sd, alpha, rng) < 0.8 + POWER_TOL
    if members == 18:  # the verdict of a claim is the sign-flip test: on pass@k-like bounded differences
        # (a share of n = 64 samples each side) it reaches the planned power too
        p = rng.uniform(0.05, 0.95, (POWER_REPS, n))
        diffs = rng.binomial(64, np.clip(p + effect, 0, 1)) / 64 - rng.binomial(64, p) / 64
        flip, _ = paired.flip_test(diffs[:, None], 1000, 0)
        assert (flip[:, 0] < alpha).mean() >= 0.8 - POWER_TOL


def _mcnemar_p(cells: np.ndarray) -> np.ndarray:
    """Exact McNemar p of (right_to_wrong, wrong_to_right) rows, vectorised: the two-sided binomial test at
    0.5 is twice its smaller tail."""
    b, c = cells[:, 0], cells[:, 1]
    return np.minimum(1.0, 2 * binom.cdf(np.minimum(b, c), b + c, 0.5))


def test_mcnemar_prompts_needed_reaches_the_stated_power():
    # the post-hoc figure: 12 flips against 5 on 95 prompts (the issue's), planned at 0.05 and at 0.05 / 6
    rng = np.random.default_rng(9)
    for alpha in (ALPHA, ALPHA / 6):
        n = paired.mcnemar_prompts_needed(5, 12, 95, alpha)
        achieved = []
        for size in (n, n - n // 10):  # at the figure, and 10% fewer prompts
            cells = rng.multinomial(size, [5 / 95, 12 / 95, 78 / 95], POWER_REPS)
            p = _mcnemar_p(cells)
            b, c, _ = cells[0]
            assert p[0] == pytest.approx(
                paired.mcnemar([True] * b + [False] * c, [False] * b + [True] * c)["mcnemar_p"]
            )
            achieved.append((p < alpha).mean())
        assert achieved[0] >= 0.8 - POWER_TOL and achieved[1] < 0.8, (n, achieved)


@cache
def _claim_study(spread: float) -> tuple[np.ndarray, np.ndarray]:
    """Per replication an arm's accuracy per seed on the held-out set (reps, seeds; checkpoints that vary from
    run to run by `spread`) and the procedure's expected accuracy on those prompts (over the run effect, by
    20-point Gauss-Hermite quadrature): what one fixed checkpoint equal to the procedure would score."""
    rng = np.random.default_rng(11)
    prompts = SETS[0]
    difficulty = rng.normal(0, 2, (REPS, 1, prompts))
    slope = float((expit(difficulty) * (1 - expit(difficulty))).mean())
    shift = rng.normal(0, 1, (REPS, SEEDS, 1)) * spread / slope
    acc = (rng.random((REPS, SEEDS, prompts)) < expit(difficulty + shift)).mean(axis=-1)
    nodes, weights = hermegauss(20)
    expected = (expit(difficulty + nodes[None, :, None] * spread / slope).mean(axis=-1) @ weights) / weights.sum()
    return acc, expected


@pytest.mark.parametrize("expect, truth", [("greater", 0.0), ("at_least", -MARGIN)])
def test_claims_against_a_fixed_checkpoint_hold_their_level_at_the_null(expect, truth):
    # a claim of an arm (5 seeds, 2-point run-to-run spread) against one fixed checkpoint (the init) whose
    # accuracy is the procedure's expected one plus -truth: at the null of the claim's test (no difference;
    # for >= a difference of exactly -margin) the one-sample t-test over seeds is wrong at most at the level
    # (measured: greater 5.05% either way, 2.6% falsely reproduced; at_least 2.6% falsely reproduced, one side
    # of a two-sided test)
    acc, expected = _claim_study(0.02)
    fixed = expected - truth
    against = spectrum.null(expect, MARGIN)
    p = ttest_1samp(acc - fixed[:, None], against, axis=1).pvalue
    shift = acc.mean(axis=1) - fixed - against
    verdicts = np.array([spectrum.reading(expect, d, q < ALPHA) for d, q in zip(shift, p, strict=True)])
    wrong = verdicts != "inside the noise" if expect == "greater" else verdicts == "reproduced"
    assert wrong.mean() <= UPPER, wrong.mean()
    # the simulation's test is what a claim runs: seed_test with the checkpoint held fixed, on one replication
    one = arms.seed_test([fixed[0]] * SEEDS, list(acc[0]), ALPHA, fixed=True, null=against)
    assert one.p == pytest.approx(p[0]) and one.null == (against or None)
