"""A study's pass@k spectrum: per arm (and the checkpoint the arms start from) pass@k at every power
of two up to n with its interval over prompt clusters, coverage over seeds, and published claims about
the curve checked with paired tests across prompts and seeds. Every arm is read at the smallest n of
the eval set, pass@k and coverage alike (a warning names the counts when some arm drew more).

A claim names arms `new`, one arm `old` (or the init checkpoint, e.g. 'sft'), the direction expected
and the k it is about. A claim is about the training procedure, so its verdict comes from a test whose
unit is the seed (rung.eval.arms.seed_test) at each k: arm against arm, the paired t-test over seeds;
against the init, one checkpoint, the one-sample t-test of the arm's per-seed differences from it (valid
with that checkpoint taken as given: the claim is about training from it, not about rerunning SFT). A >= or
<= claim is tested against the study's non-inferiority margin (`null`): without one it could never be
shown. Every k of every (claim, arm, eval set) is one member of one Holm family (arms.correct_seeds). The
verdict reads that adjusted p and the sign of the difference from the null:
- "reproduced" when significant in the expected direction, "contradicted" when significant the
  other way, else "inside the noise".
A claim over several k is contradicted when any k is, reproduced when every k is, else inside the
noise. Beside it, read the same way against 0 (`checkpoints`), the prompt-level test about these
checkpoints (the seeds run held fixed): the unit a prompt cluster (its pass@k in every seed that answered
it: rung.eval.arms.arm_units with value pass_at(k, n)), the claim's k one family (the bootstrap band over
them, rung.eval.paired.intervals, and the sign-flip test's max-T, rung.eval.paired.flip_test), every
(claim, arm, eval set) one member of a Holm family: a member's p is its smallest over k, and a k's adjusted
p is the larger of its member's Holm-adjusted p and its own p times the member's Holm multiplier. The
planning statement (not post-hoc power): prompts a paired t-test at the family's strictest level (level /
members) would need to see the study's reference effect at 80% power, from the spread of the per-prompt
differences, and seeds (at level / (members x k)) from the spread of the per-seed differences
(rung.eval.paired.units_needed, by the noncentral t).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean, stdev
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rung.errors import InputError
from rung.eval import arms, metrics, paired
from rung.eval.results import ArmsTest, Band, ClaimResult, ClaimTest, EvalRecord, Spread, StudyRun

# arm -> seed -> eval set -> sampled records
Sampled = dict[str, dict[int, dict[str, list[EvalRecord]]]]


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")

    claim: str
    """The claim in words, as the page shows it."""
    new: list[str] = Field(min_length=1)
    """Arms the claim is about, each checked against `old`."""
    old: str
    """The arm (or the init checkpoint, e.g. 'sft') they are compared with."""
    expect: Literal["greater", "at_least", "less", "at_most"]
    """The direction the claim expects of new - old."""
    k: list[int] | Literal["all", "n"] = "all"
    """The k it is about: 'all' every k of the spectrum (powers of two up to n), 'n' coverage (pass@n)."""
    sets: list[str] | None = None
    """Eval sets it is checked on; None: every sampled set."""


def sampled_records(runs: Sequence[StudyRun], init: str) -> Sampled:
    """The sampled records per arm and seed, after those of the init checkpoint as an arm named `init`."""
    out: Sampled = {init: {}}
    for r in runs:
        if r.get("samples"):
            out.setdefault(r["arm"], {})[r["seed"]] = r["samples"]
        if r.get("init_samples"):
            out[init][r["seed"]] = r["init_samples"]
    return {arm: seeds for arm, seeds in out.items() if seeds}


def _values(by_seed: Mapping[int, Sequence[EvalRecord]], k: int, n: int) -> dict[int, dict[str, float]]:
    """Each seed's pass@k per prompt id, from the first n samples."""
    value = arms.pass_at(k, n)
    return {s: {r["id"]: value(r) for r in records} for s, records in by_seed.items()}


def curves(
    sampled: Sampled, confidence: float
) -> tuple[dict[str, dict[str, list[Band]]], dict[str, dict[str, Spread]]]:
    """Per eval set and arm: the spectrum (k, mean pass@k, band low, band high) and coverage over seeds,
    both at the smallest number of samples of the set over every arm and seed (metrics.common_n warns
    when some record has more), so that arms that drew different n compare at one n. The band at each k
    is the interval of the mean over prompt clusters (arms.unit_values; metrics.share_interval, each
    cluster's mean weighted by its rows): it stays open at 0% and 100%."""
    spectrum: dict[str, dict[str, list[Band]]] = {}
    coverage: dict[str, dict[str, Spread]] = {}
    names = dict.fromkeys(name for seeds in sampled.values() for sets in seeds.values() for name in sets)
    for name in names:
        by_arm = {arm: {s: sets[name] for s, sets in seeds.items() if name in sets} for arm, seeds in sampled.items()}
        by_arm = {arm: by_seed for arm, by_seed in by_arm.items() if by_seed}
        n = metrics.common_n(
            [r for by_seed in by_arm.values() for records in by_seed.values() for r in records], f"spectrum of {name}"
        )
        for arm, by_seed in by_arm.items():
            ks = metrics.spectrum_ks(n)
            clusters = [arms.unit_values(_values(by_seed, k, n)) for k in ks]
            sizes = clusters[0][1]
            means = np.array([c[0] for c in clusters]) / sizes  # (k, clusters): each cluster's mean over its rows
            low, high = metrics.share_interval(means, confidence, sizes)
            spectrum.setdefault(name, {})[arm] = [
                (k, float(m @ sizes / sizes.sum()), float(lo), float(hi))
                for k, m, lo, hi in zip(ks, means, low, high, strict=True)
            ]
            cov = [
                metrics.coverage([sum(s["correct"] for s in r["samples"][:n]) for r in recs])
                for recs in by_seed.values()
            ]
            coverage.setdefault(name, {})[arm] = Spread(
                mean=mean(cov), sd=stdev(cov) if len(cov) > 1 else None, values=cov
            )
    return spectrum, coverage


def reading(expect: str, difference: float, significant: bool) -> str:
    """A claim's verdict from a test's significance and the difference from its null (module docstring)."""
    if not significant or difference == 0:
        return "inside the noise"
    right = difference > 0 if expect in ("greater", "at_least") else difference < 0
    return "reproduced" if right else "contradicted"


def _overall(verdicts: list[str]) -> str:
    if "contradicted" in verdicts:
        return "contradicted"
    return "reproduced" if all(v == "reproduced" for v in verdicts) else "inside the noise"


def null(expect: str, margin: float) -> float:
    """The difference new - old a claim's seed-level test is against: 0 for a strict claim (> or <); for a
    non-inferiority claim the margin on the side it allows (>=: -margin, <=: +margin)."""
    return {"at_least": -margin, "at_most": margin}.get(expect, 0.0)


def check_claim(
    claim: Claim,
    new: str,
    name: str,
    sampled: Sampled,
    confidence: float,
    resamples: int,
    seed: int,
    fixed: bool = False,
    margin: float = 0.0,
) -> tuple[list[int], list[arms.Units], list[ArmsTest]]:
    """One claim for one arm on one eval set, before the family correction: its k, the units at each
    k (pass@k at the common n of the two arms) and a test per k whose interval is the band over the k,
    whose p is the max-T over them (about these checkpoints), and whose procedure is the t-test over seeds
    against the claim's null (arms.seed_test; `fixed`: old is one checkpoint taken as given)."""
    old_seeds, new_seeds = sampled[claim.old], sampled[new]
    if len(old_seeds) == 1 and len(new_seeds) > 1:  # one eval of old (e.g. the init) serves every seed
        only = next(iter(old_seeds.values()))
        old_seeds = {s: only for s in new_seeds}
    old = {s: sets[name] for s, sets in old_seeds.items()}
    new_records = {s: sets[name] for s, sets in new_seeds.items()}
    n = min(len(r["samples"]) for by_seed in (old, new_records) for records in by_seed.values() for r in records)
    ks = metrics.spectrum_ks(n) if claim.k == "all" else [n] if claim.k == "n" else claim.k
    if any(not 1 <= k <= n for k in ks):
        raise InputError(f"claims: {claim.claim!r}: k {ks} outside 1..{n} (the samples per prompt)")
    what = f"{new} vs {claim.old} on {name}"
    units = [arms.arm_units(old, new_records, what, arms.pass_at(k, n)) for k in ks]
    diffs = np.array([u.new - u.old for u in units])
    _, low, high = paired.intervals(diffs, units[0].sizes, confidence, resamples, seed)
    p, exact = paired.flip_test(diffs, resamples, seed)
    test = paired.flip_name(exact, resamples)
    alpha, against = paired.level(confidence), null(claim.expect, margin)
    tests = []
    for u, lo, hi, pk in zip(units, low, high, p, strict=True):
        procedure = arms.seed_test(u.seed_old, u.seed_new, alpha, fixed=fixed, null=against)
        update = {"ci_low": float(lo), "ci_high": float(hi), "p": float(pk), "test": test, "procedure": procedure}
        if fixed:  # the differences the procedure's test reads: from the one checkpoint's mean
            base = mean(u.seed_old)
            update["per_seed_difference"] = {str(s): v - base for s, v in zip(u.seeds, u.seed_new, strict=True)}
        tests.append(arms.units_test(u, confidence, resamples, seed).model_copy(update=update))
    return ks, units, tests


def check_claims(
    claims: Sequence[Claim],
    sampled: Sampled,
    confidence: float,
    resamples: int,
    seed: int,
    reference_effect: float,
    init: str | None = None,
    margin: float = 0.0,
) -> list[ClaimResult]:
    """Every claim for each of its arms on each of its eval sets (InputError naming an unknown arm or
    set), the whole family held to the study's level by Holm (module docstring); `init` the checkpoint held
    fixed when a claim compares with it, `margin` the non-inferiority margin of >= and <= claims."""
    checked = []
    for claim in claims:
        for arm in [*claim.new, claim.old]:
            if arm not in sampled:
                raise InputError(f"claims: {claim.claim!r}: no sampled evaluation of {arm!r} (have {sorted(sampled)})")
        have = list(next(iter(sampled[claim.old].values())))
        for name in claim.sets or have:
            if name not in have:
                raise InputError(f"claims: {claim.claim!r}: no sampled eval set {name!r} (have {have})")
            for new in claim.new:
                found = check_claim(claim, new, name, sampled, confidence, resamples, seed, claim.old == init, margin)
                checked.append((claim, new, name, *found))
    alpha = paired.level(confidence)
    members = [min(t.p for t in tests) for *_, tests in checked]
    adjusted, factors = paired.holm(members), paired.holm_factor(members)
    family = f"Holm over {len(checked)}: claims x arms x eval sets; max-T over each claim's k"
    strict = alpha / max(len(checked), 1)
    # the verdicts: the t-tests over seeds, one family of every k of every member
    tests = [t for *_, ts in checked for t in ts]
    procedures = iter(
        arms.correct_seeds(
            [t.procedure for t in tests],
            [list(t.per_seed_difference.values()) for t in tests],
            alpha,
            f"Holm over {len(tests)}: claims x arms x eval sets x k",
        )
    )
    strict_seeds = alpha / max(len(tests), 1)
    out = []
    for (claim, new, name, ks, units, tests), member, factor in zip(checked, adjusted, factors, strict=True):
        rows = []
        for k, u, t in zip(ks, units, tests, strict=True):
            p = max(member, min(1.0, factor * t.p))
            procedure = next(procedures)
            fields = {f: v for f, v in t.dump().items() if f != "prompts_needed"}
            fields |= {
                "p": p,
                "family": family,
                "significant": p < alpha,
                "verdict": paired.verdict(p < alpha, alpha, t.test),
                "procedure": procedure,
            }
            diffs = (u.new - u.old) / u.sizes  # per-prompt mean difference over its seeds
            per_seed = list(t.per_seed_difference.values())
            shift = mean(per_seed) - (procedure.null or 0.0)
            rows.append(
                ClaimTest(
                    k=k,
                    test=ArmsTest.model_validate(fields),
                    verdict=reading(claim.expect, shift, procedure.significant),
                    checkpoints=reading(claim.expect, t.difference, p < alpha),
                    prompts_needed_reference=paired.units_needed(
                        float(np.std(diffs, ddof=1)) if len(diffs) > 1 else 0.0, reference_effect, strict
                    ),
                    seeds_needed_reference=paired.units_needed(stdev(per_seed), reference_effect, strict_seeds)
                    if len(per_seed) > 1
                    else None,
                )
            )
        out.append(
            ClaimResult(
                claim=claim.claim,
                new=new,
                old=claim.old,
                eval_set=name,
                expect=claim.expect,
                verdict=_overall([r.verdict for r in rows]),
                tests=rows,
            )
        )
    return out
