"""Arms of a study compared over seeds: the paired prompt clusters of two arms (`arm_units`), the verdict
about the training procedure (`seed_test`, a test whose unit is the seed), the prompt-level tests about
these checkpoints beside it (`units_test`, from rung.eval.paired), and a study's family correction
(`correct`, Holm).

The verdict about a training procedure: the paired t-test over seeds (`seed_test`, scipy.stats.ttest_rel
on each seed's accuracy of the two arms). Whole checkpoints vary from run to run, so the seed is the unit
of a claim about the procedure: the prompt-level tests hold the seeds run fixed and, with checkpoints that
vary per seed by 1 or 2 points, give 11% or 27% false alarms at 5 seeds; the t-test over seeds holds its
level (tests/test_calibration_studies.py). It is conditional on the prompts (all seeds' differences are on
them). The sign-flip test over prompt clusters stays beside it, as what it is: about these checkpoints. Why
not the exact sign-flip over seeds: its floor is 2 / 2^seeds (5 seeds: 0.0625), it could never reach 0.05.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from statistics import mean
from typing import NamedTuple

import numpy as np
from scipy.stats import ttest_1samp

from rung.errors import InputError
from rung.eval import metrics
from rung.eval.paired import Record, align, flip_name, flip_test, holm, intervals, judged, level, units_needed, verdict
from rung.eval.results import ArmsTest, SeedTest

SEED_T = "paired t-test over seeds"
FIXED_T = "one-sample t-test over seeds, old held fixed"


def greedy_correct(record: Record) -> float:
    """A record's greedy outcome: True (1) when its first completion is graded correct. A bool, so that
    means over seeds keep the types the study files had (statistics.mean of bools can be an int)."""
    return bool(record["samples"][0]["correct"])


def pass_at(k: int, n: int | None = None) -> Callable[[Record], float]:
    """A record's pass@k from its first n sampled completions (all without n; the unbiased estimator,
    rung.eval.metrics): n is the common n of a comparison, so that pass@k and coverage are read at one n."""

    def value(record: Record) -> float:
        hits = [s["correct"] for s in record["samples"][:n]]
        return metrics.pass_at_k(len(hits), sum(hits), k)

    return value


def unit_values(values: Mapping[int, Mapping[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The clusters of a comparison over seeds from each seed's value per prompt id: per prompt (in
    first-seen order, seed by seed) the sum of its values over the seeds that answered it, and their
    number. All seeds share the prompts: every cluster holds one row per seed; the seed also changed
    the data: a prompt only some seeds answered holds fewer, and still counts once."""
    sums: dict[str, float] = {}
    sizes: dict[str, int] = {}
    for by_id in values.values():
        for i, v in by_id.items():
            sums[i] = sums.get(i, 0.0) + float(v)
            sizes[i] = sizes.get(i, 0) + 1
    return np.array(list(sums.values())), np.array(list(sizes.values()), dtype=float)


class Units(NamedTuple):
    """Two arms' prompt clusters on one eval set (unit_values: sums over the seeds and rows per
    cluster, in one prompt order) and their means per seed."""

    seeds: list[int]
    old: np.ndarray
    new: np.ndarray
    sizes: np.ndarray
    seed_old: list[float]
    seed_new: list[float]


def arm_units(
    old: Mapping[int, Sequence[Record]],
    new: Mapping[int, Sequence[Record]],
    what: str,
    value: Callable[[Record], float] = greedy_correct,
) -> Units:
    """The paired clusters of arms `new` and `old` over the seeds both ran, each record scored by
    `value`; an InputError when they share no seed or a seed's two arms answered different prompts."""
    seeds = [s for s in old if s in new]
    if not seeds:
        raise InputError(f"{what}: no seed that both arms ran")
    pairs = {s: sorted(align(old[s], new[s], f"{what}, seed {s}"), key=lambda pair: pair[0]["id"]) for s in seeds}
    scored = [{s: {p[side]["id"]: value(p[side]) for p in pairs[s]} for s in seeds} for side in (0, 1)]
    (x_old, sizes), (x_new, _) = unit_values(scored[0]), unit_values(scored[1])
    return Units(
        seeds,
        x_old,
        x_new,
        sizes,
        [mean(scored[0][s].values()) for s in seeds],
        [mean(scored[1][s].values()) for s in seeds],
    )


def seed_test(
    old: Sequence[float],
    new: Sequence[float],
    alpha: float,
    plan: float | None = None,
    fixed: bool = False,
    null: float = 0.0,
) -> SeedTest:
    """The procedure's verdict from each seed's value of two arms (same seed index paired): the paired
    t-test over seeds of new - old = `null` (scipy.stats.ttest_1samp of the differences, which is ttest_rel
    at null 0; the module docstring says why this test). `fixed`: old is one checkpoint (e.g. the init every
    arm starts from), its mean over `old` taken as given, so the test is the one-sample t-test of the arm's
    per-seed differences from it: about the procedure given that checkpoint, not about rerunning it. When not
    significant, the seeds a t-test at `plan` (default `alpha`) needs for this mean difference at 80%
    power. No test (p None) with fewer than 2 seeds or differences that never vary (scipy gives nan)."""
    if fixed:
        old = [float(np.mean(old))] * len(old)
    diffs = np.subtract(new, old)
    name = seed_name(fixed, null)
    if len(diffs) < 2 or np.ptp(diffs) == 0:
        return SeedTest(
            test=name,
            seeds=len(diffs),
            p=None,
            significant=False,
            verdict=f"no {name}: it needs 2 or more seeds whose differences vary",
            **({"null": null} if null else {}),
        )
    p = float(ttest_1samp(diffs, null).pvalue)
    return _seed_judged(diffs, p, alpha, plan, name, null)


def seed_name(fixed: bool, null: float) -> str:
    """The test's name: paired over seeds, or one-sample against a fixed checkpoint; and its null when not 0."""
    base = FIXED_T if fixed else SEED_T
    return f"{base}, against a difference of {100 * null:+g} points" if null else base


def _seed_judged(
    diffs: np.ndarray, p: float, alpha: float, plan: float | None, test: str = SEED_T, null: float = 0.0
) -> SeedTest:
    """The procedure's verdict at `alpha` from its (possibly adjusted) p, with seeds needed when not significant."""
    significant = p < alpha
    effect = float(np.mean(diffs)) - null
    needed = None if significant else units_needed(float(np.std(diffs, ddof=1)), effect, plan or alpha)
    return SeedTest(
        test=test,
        seeds=len(diffs),
        p=p,
        significant=significant,
        verdict=verdict(significant, alpha, test),
        **({"null": null} if null else {}),
        **({} if significant else {"seeds_needed": needed}),
    )


def units_test(units: Units, confidence: float, resamples: int, seed: int) -> ArmsTest:
    """The tests of arm_units' clusters at the level of `confidence` (a study's family correction,
    `correct`, adjusts p and verdict after): difference and interval, the sign-flip test, the
    clusters each way, the per-seed differences and the procedure's test over seeds (`seed_test`)."""
    d = units.new - units.old
    est, lo, hi = intervals(d[None], units.sizes, confidence, resamples, seed)
    p, exact = flip_test(d[None], resamples, seed)
    up, down = int((d > 0).sum()), int((d < 0).sum())
    diffs = [n - o for n, o in zip(units.seed_new, units.seed_old, strict=True)]
    alpha, test = level(confidence), flip_name(exact, resamples)
    rows = float(units.sizes.sum())
    return ArmsTest(
        seeds=units.seeds,
        unit="prompt",
        units=len(d),
        rows=int(rows),
        accuracy_old=float(units.old.sum() / rows),
        accuracy_new=float(units.new.sum() / rows),
        difference=float(est[0]),
        ci_low=float(lo[0]),
        ci_high=float(hi[0]),
        units_better=up,
        units_worse=down,
        p=float(p[0]),
        test=test,
        per_seed_difference={str(s): d for s, d in zip(units.seeds, diffs, strict=True)},
        procedure=seed_test(units.seed_old, units.seed_new, alpha),
        **judged(bool(p[0] < alpha), alpha, test, down, up, len(d)),
    )


def correct_seeds(
    tests: Sequence[SeedTest], diffs: Sequence[Sequence[float]], alpha: float, family: str
) -> list[SeedTest]:
    """The procedure's tests of a family held to `alpha` together (Holm over those with a p; `diffs`
    each one's per-seed differences, for the seeds needed at the family's strictest level)."""
    tested = [i for i, t in enumerate(tests) if t.p is not None]
    adjusted = dict(zip(tested, holm([float(tests[i].p) for i in tested]), strict=True))  # type: ignore[arg-type]
    strict = alpha / max(len(tested), 1)
    return [
        _seed_judged(np.asarray(diffs[i], dtype=float), adjusted[i], alpha, strict, t.test, t.null or 0.0).model_copy(
            update={"family": family}
        )
        if i in adjusted
        else t
        for i, t in enumerate(tests)
    ]


def correct(tests: Sequence[ArmsTest], alpha: float, family: str) -> list[ArmsTest]:
    """A family of tests held to `alpha` together (Holm), twice: the procedure's p over seeds
    (`correct_seeds`) and the p over prompts about these checkpoints, each replaced by its Holm-adjusted
    p, significant when that is below `alpha`, and seeds / prompts needed at the family's strictest
    level alpha / size (what a member must clear whatever the others do)."""
    strict = alpha / max(len(tests), 1)
    procedures = correct_seeds(
        [t.procedure for t in tests], [list(t.per_seed_difference.values()) for t in tests], alpha, family
    )
    out = []
    for t, p, procedure in zip(tests, holm([t.p for t in tests]), procedures, strict=True):
        fields = {k: v for k, v in t.dump().items() if k not in ("prompts_needed", "procedure")}
        verdicts = judged(p < alpha, alpha, t.test, t.units_worse, t.units_better, t.units, strict)
        out.append(ArmsTest.model_validate({**fields, "p": p, "family": family, "procedure": procedure, **verdicts}))
    return out


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
