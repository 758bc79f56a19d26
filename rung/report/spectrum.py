"""A study's pass@k spectrum: per arm (and the checkpoint the arms start from) pass@k at every power
of two up to n with a bootstrap band over prompts, coverage over seeds, and published claims about the
curve checked with paired tests across prompts and seeds.

A claim names arms `new`, one arm `old` (or the init checkpoint, e.g. 'sft'), the direction expected
and the k it is about. At each k the unit is a prompt, its value the pass@k of its n samples averaged
over seeds (rung.eval.paired.arms_test with value pass_at(k)); the verdict reads the paired bootstrap
interval of the difference new - old:
- expect greater / less: "reproduced" when the interval excludes 0 in the expected direction,
  "contradicted" when it excludes 0 the other way, else "inside the noise";
- expect at_least / at_most: "contradicted" only when the interval excludes 0 the wrong way,
  "reproduced" when it excludes 0 the right way, else "inside the noise" (not contradicted).
A claim over several k is contradicted when any k is, reproduced when every k is, else inside the
noise. The power statement: prompts a paired test would need to see this difference (and the
study's reference effect) at 80% power, from the spread of the per-prompt differences, and seeds
from the spread of the per-seed differences (rung.eval.paired.units_needed).
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


def _n(by_seed: Mapping[int, Sequence[EvalRecord]]) -> int:
    return min(len(rec["samples"]) for records in by_seed.values() for rec in records)


def _per_prompt(by_seed: Mapping[int, Sequence[EvalRecord]], k: int) -> dict[str, float]:
    """Each prompt's pass@k, averaged over seeds."""
    value = paired.pass_at(k)
    ids = [r["id"] for r in next(iter(by_seed.values()))]
    per_seed = [{r["id"]: value(r) for r in records} for records in by_seed.values()]
    return {i: mean(s[i] for s in per_seed) for i in ids}


def curves(
    sampled: Sampled, confidence: float, resamples: int, seed: int
) -> tuple[dict[str, dict[str, list[Band]]], dict[str, dict[str, Spread]]]:
    """Per eval set and arm: the spectrum (k, mean pass@k, band low, band high) and coverage over seeds."""
    spectrum: dict[str, dict[str, list[Band]]] = {}
    coverage: dict[str, dict[str, Spread]] = {}
    for arm, seeds in sampled.items():
        for name in next(iter(seeds.values())):
            by_seed = {s: sets[name] for s, sets in seeds.items() if name in sets}
            points: list[Band] = []
            for k in metrics.spectrum_ks(_n(by_seed)):
                values = list(_per_prompt(by_seed, k).values())
                points.append((k, float(np.mean(values)), *metrics.bootstrap_ci(values, confidence, resamples, seed)))
            spectrum.setdefault(name, {})[arm] = points
            cov = [
                metrics.coverage([sum(s["correct"] for s in r["samples"]) for r in recs]) for recs in by_seed.values()
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
    n = min(_n(old), _n(new_records))
    ks = metrics.spectrum_ks(n) if claim.k == "all" else [n] if claim.k == "n" else claim.k
    if any(not 1 <= k <= n for k in ks):
        raise InputError(f"claims: {claim.claim!r}: k {ks} outside 1..{n} (the samples per prompt)")
    alpha = paired.level(confidence)
    tests = []
    for k in ks:
        test = paired.arms_test(
            old, new_records, confidence, resamples, seed, f"{new} vs {claim.old} on {name}", value=paired.pass_at(k)
        )
        a, b = _per_prompt({s: old[s] for s in test.seeds}, k), _per_prompt({s: new_records[s] for s in test.seeds}, k)
        diffs = [b[i] - a[i] for i in a]
        sd = float(np.std(diffs, ddof=1)) if len(diffs) > 1 else 0.0
        per_seed = list(test.per_seed_difference.values())
        tests.append(
            ClaimTest(
                k=k,
                test=test,
                verdict=_verdict(claim.expect, test.ci_low, test.ci_high),
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
