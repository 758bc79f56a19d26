"""A study's pass@k spectrum: per arm (and the checkpoint the arms start from) pass@k at every power
of two up to n with a bootstrap band over prompts, coverage over seeds, and published claims about the
curve checked with paired tests across prompts and seeds. Every arm is read at the smallest n of the
eval set (a warning names the counts when some arm drew more).

A claim names arms `new`, one arm `old` (or the init checkpoint, e.g. 'sft'), the direction expected
and the k it is about. At each k the unit is a prompt, its value the pass@k of its n samples averaged
over seeds, or a (seed, prompt) pair when the seeds answered different prompts (rung.eval.paired
.arm_units with value pass_at(k)); the verdict reads the paired bootstrap band of the difference
new - old, simultaneous over the claim's k (rung.eval.paired.simultaneous_band: all k covered at once
with the study's confidence, so a claim over 7 k is not 7 chances of a false alarm; with one k it is
the percentile interval):
- expect greater / less: "reproduced" when the band excludes 0 in the expected direction,
  "contradicted" when it excludes 0 the other way, else "inside the noise";
- expect at_least / at_most: "contradicted" only when the band excludes 0 the wrong way,
  "reproduced" when it excludes 0 the right way, else "inside the noise" (not contradicted).
A claim over several k is contradicted when any k is, reproduced when every k is, else inside the
noise. The power statement: units a paired t-test would need to see this difference (and the
study's reference effect) at 80% power, from the spread of the per-unit differences, and seeds
from the spread of the per-seed differences (rung.eval.paired.units_needed, by the noncentral t).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import mean, stdev
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rung.errors import InputError
from rung.eval import metrics, paired
from rung.eval.results import Band, ClaimResult, ClaimTest, EvalRecord, Spread, StudyRun

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


def _values(by_seed: Mapping[int, Sequence[EvalRecord]], k: int) -> dict[int, dict[str, float]]:
    """Each seed's pass@k per prompt id."""
    value = paired.pass_at(k)
    return {s: {r["id"]: value(r) for r in records} for s, records in by_seed.items()}


def curves(
    sampled: Sampled, confidence: float, resamples: int, seed: int
) -> tuple[dict[str, dict[str, list[Band]]], dict[str, dict[str, Spread]]]:
    """Per eval set and arm: the spectrum (k, mean pass@k, band low, band high) and coverage over seeds,
    both at the smallest number of samples of the set over every arm and seed (metrics.common_n warns
    when some record has more), so that arms that drew different n compare at one n. The unit of the
    band is a prompt, or a (seed, prompt) pair when seeds answered different prompts (paired.unit_values)."""
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
            points: list[Band] = []
            for k in metrics.spectrum_ks(n):
                values, strata = paired.unit_values(_values(by_seed, k))
                points.append(
                    (k, float(np.mean(values)), *metrics.bootstrap_ci(values, confidence, resamples, seed, strata))
                )
            spectrum.setdefault(name, {})[arm] = points
            cov = [
                metrics.coverage([sum(s["correct"] for s in r["samples"][:n]) for r in recs])
                for recs in by_seed.values()
            ]
            coverage.setdefault(name, {})[arm] = Spread(
                mean=mean(cov), sd=stdev(cov) if len(cov) > 1 else None, values=cov
            )
    return spectrum, coverage


def _verdict(expect: str, low: float, high: float) -> str:
    up, down = low > 0, high < 0
    right, wrong = (up, down) if expect in ("greater", "at_least") else (down, up)
    return "reproduced" if right else "contradicted" if wrong else "inside the noise"


def _overall(verdicts: list[str]) -> str:
    if "contradicted" in verdicts:
        return "contradicted"
    return "reproduced" if all(v == "reproduced" for v in verdicts) else "inside the noise"


def check_claim(
    claim: Claim,
    new: str,
    name: str,
    sampled: Sampled,
    confidence: float,
    resamples: int,
    seed: int,
    reference_effect: float,
) -> ClaimResult:
    """One claim for one arm on one eval set: a paired test per k, a verdict per k and overall."""
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
    alpha = paired.level(confidence)
    what = f"{new} vs {claim.old} on {name}"
    units = [paired.arm_units(old, new_records, what, paired.pass_at(k)) for k in ks]
    # one band over the claim's k: its verdict is wrong at any k with probability 1 - confidence at most
    band = paired.simultaneous_band(
        [u.old for u in units], [u.new for u in units], confidence, resamples, seed, units[0].strata
    )
    tests = []
    for k, u, (low, high) in zip(ks, units, band, strict=True):
        test = paired.units_test(u, confidence, resamples, seed).model_copy(update={"ci_low": low, "ci_high": high})
        diffs = u.new - u.old
        sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else 0.0
        per_seed = list(test.per_seed_difference.values())
        tests.append(
            ClaimTest(
                k=k,
                test=test,
                verdict=_verdict(claim.expect, low, high),
                prompts_needed=paired.units_needed(sd, test.difference, alpha),
                prompts_needed_reference=paired.units_needed(sd, reference_effect, alpha),
                seeds_needed=paired.units_needed(stdev(per_seed), test.difference, alpha)
                if len(per_seed) > 1
                else None,
            )
        )
    return ClaimResult(
        claim=claim.claim,
        new=new,
        old=claim.old,
        eval_set=name,
        expect=claim.expect,
        verdict=_overall([t.verdict for t in tests]),
        tests=tests,
    )


def check_claims(
    claims: Sequence[Claim],
    sampled: Sampled,
    confidence: float,
    resamples: int,
    seed: int,
    reference_effect: float,
) -> list[ClaimResult]:
    """Every claim for each of its arms on each of its eval sets (InputError naming an unknown arm or set)."""
    out = []
    for claim in claims:
        for arm in [*claim.new, claim.old]:
            if arm not in sampled:
                raise InputError(f"claims: {claim.claim!r}: no sampled evaluation of {arm!r} (have {sorted(sampled)})")
        have = list(next(iter(sampled[claim.old].values())))
        for name in claim.sets or have:
            if name not in have:
                raise InputError(f"claims: {claim.claim!r}: no sampled eval set {name!r} (have {have})")
            for new in claim.new:
                out.append(check_claim(claim, new, name, sampled, confidence, resamples, seed, reference_effect))
    return out
