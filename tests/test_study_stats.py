"""The statistics of a study's evidence (issue #37): seeds that answer different prompts, power over
few units by the noncentral t, claims over many k held to their family-wise level, coverage at a
common n and a warning when samples are cut, the spectrum's k only, and maj@k on answers the
task's grader calls equal."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from scipy.stats import nct, t

from rung.answers.verify import answer_class
from rung.eval import arms, metrics, paired
from rung.eval.evaluate import summarize_sampled
from rung.report import spectrum, study
from tests.records import sampled, study_run


def _records(counts: list[int], n: int, prefix: str = "", first: int = 0) -> list[dict]:
    """sampled(counts, n) with ids prefix + i; the correct samples start at index `first`."""
    return [
        {"id": f"{prefix}{r['id']}", "samples": [{"correct": first <= j < first + c} for j in range(n)]}
        for r, c in zip(sampled(counts, n), counts, strict=True)
    ]


def _run(arm: str, seed: int, samples: list[dict], init: list[dict]) -> dict:
    return {**study_run(arm, seed, 0.5, [True, False]), "samples": {"test": samples}, "init_samples": {"test": init}}


def test_seeds_that_answer_different_prompts_give_one_cluster_per_prompt():
    # curation samples rows by seed: seed 1 answers prompts a0..a3, seed 2 b0..b3
    runs = [
        _run("rl", s, _records(c, 4, p), _records([1, 1, 0, 0], 4, p))
        for s, p, c in ((1, "a", [4, 4, 0, 0]), (2, "b", [4, 2, 2, 0]))
    ]
    claim = {"claim": "RL > SFT at k = 1", "new": ["rl"], "old": "sft", "expect": "greater", "k": [1]}
    spec = study.Study(name="p", seeds=[1, 2], arms={"rl": {}}, claims=[claim])
    result = study.aggregate(spec, runs, 0.95, 200, 0, init="sft")
    rl = result.spectrum["test"]["rl"]
    assert rl[0][1] == pytest.approx((4 + 4 + 0 + 0 + 4 + 2 + 2 + 0) / 4 / 8)  # pass@1 over the 8 (seed, prompt) rows
    (c,) = result.claims
    assert c.tests[0].test.unit == "prompt" and c.tests[0].test.units == 8 == c.tests[0].test.rows
    assert c.tests[0].test.difference == pytest.approx(rl[0][1] - result.spectrum["test"]["sft"][0][1])


@pytest.mark.parametrize("sd, effect", [(0.2, 0.1), (1.0, 1.5), (0.05, 0.1), (0.3, 0.05), (2.0, 1.0)])
def test_units_needed_reaches_the_power_of_the_paired_t_test(sd, effect):
    def power(n: int) -> float:  # two-sided paired t-test at 0.05 on n differences
        crit, nc = t.ppf(0.975, n - 1), effect / sd * np.sqrt(n)
        return nct.sf(crit, n - 1, nc) + nct.cdf(-crit, n - 1, nc)

    n = paired.units_needed(sd, effect)
    assert n >= 2 and power(n) >= 0.8
    assert n == 2 or power(n - 1) < 0.8  # the smallest such n


def test_claim_verdicts_read_the_max_t_over_its_k_and_the_family():
    rng = np.random.default_rng(4)  # identical arms where pass@8 alone looks worse
    p = rng.beta(2, 2, size=30)
    old, new = ({1: _records(list(rng.binomial(8, p)), 8)} for _ in range(2))
    alone = [arms.arms_test(old, new, 0.95, 1000, 0, "x", arms.pass_at(k)) for k in (1, 2, 4, 8)]
    assert alone[-1].ci_high < 0 < alone[-1].p - 0.05  # its interval excludes 0; its exact test does not reject
    claim = spectrum.Claim(claim="new ≥ old at every k", new=["new"], old="old", expect="at_least")
    sampled = {arm: {1: {"test": records[1]}} for arm, records in (("old", old), ("new", new))}
    (result,) = spectrum.check_claims([claim], sampled, 0.95, 1000, 0, 0.05)
    assert [t.verdict for t in result.tests] == ["inside the noise"] * 4 and result.verdict == "inside the noise"
    assert all(not t.test.significant for t in result.tests)  # study.json's verdict fields are the page's
    assert all(t.test.p >= a.p for t, a in zip(result.tests, alone, strict=True))  # max-T over the claim's k
    assert result.tests[-1].test.ci_low < 0 <= result.tests[-1].test.ci_high  # the band over k is wider


def test_coverage_is_at_the_common_n(caplog):
    # sft drew 8 samples, rl 4; sft's only right samples are its last 4, which rl's budget never sees
    init = _records([4, 0], 8, first=4)
    runs = [_run("rl", 1, _records([0, 0], 4), init)]
    spec = study.Study(name="p", seeds=[1], arms={"rl": {}})
    with caplog.at_level(logging.WARNING, logger="rung"):
        result = study.aggregate(spec, runs, 0.95, 200, 0, init="sft")
    assert result.coverage["test"]["sft"].mean == 0.0 == result.coverage["test"]["rl"].mean
    assert [p[0] for p in result.spectrum["test"]["sft"]] == [1, 2, 4]
    # pass@4 at n = 4 too (from all 8 samples it was 0.49 beside coverage 0: issue #45)
    assert result.spectrum["test"]["sft"][-1][1] == 0.0
    claim = spectrum.Claim(claim="coverage", new=["rl"], old="sft", expect="at_most", k="n")
    (c,) = spectrum.check_claims([claim], spectrum.sampled_records(runs, "sft"), 0.95, 200, 0, 0.05)
    assert c.tests[0].k == 4 and c.tests[0].test.difference == 0.0
    assert "4" in caplog.text and "8" in caplog.text


def test_cutting_samples_to_the_smallest_count_is_said(caplog):
    records = _records([1, 2, 3], 6)
    records[0]["samples"] = records[0]["samples"][:4]
    for r in records:
        r["samples"] = [{**s, "extracted": "1", "tokens": 1} for s in r["samples"]]
    with caplog.at_level(logging.WARNING, logger="rung"):
        summarize_sampled(records)
    assert "2 of 3 prompts have more than 4 samples (up to 6)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rung"):
        paired.sampled_test(records, _records([1, 2, 3], 6), 0.95, 100, 0, "x")
    assert "x: 5 of 6 prompts have more than 4 samples (up to 6)" in caplog.text


def test_tests_and_votes_only_at_the_spectrum_k():
    records = [
        {**r, "samples": [{**s, "extracted": str(j % 3), "tokens": 1} for j, s in enumerate(r["samples"])]}
        for r in _records([1, 5, 12], 12)
    ]
    assert set(summarize_sampled(records)["maj_at_k"]) == {"1", "2", "4", "8", "12"}
    assert set(paired.sampled_test(records, records, 0.95, 100, 0, "x").metrics) == {
        "avg@12",
        *(f"pass@{k}" for k in (1, 2, 4, 8, 12)),
    }
    m = summarize_sampled(records, compare_k=[3])
    assert set(m["maj_at_k"]) == {"1", "2", "3", "4", "8", "12"} and len(m["pass_at_k"]) == 12
    s = paired.sampled_test(records, records, 0.95, 100, 0, "x", compare_k=[3])
    assert set(s.metrics) == {"avg@12", *(f"pass@{k}" for k in (1, 2, 3, 4, 8, 12))}


def test_maj_at_k_votes_on_answers_the_grader_calls_equal():
    # 3 of 5 right, written three ways; the two wrong ones agree: the right answer has the majority
    votes = [("5", True), ("4", False), ("5.0", True), ("4", False), ("5.00", True)]
    assert metrics.maj_at_k([votes], 5) == 1.0
    # wrong answers written three ways outvote two right ones once the grader says they are one answer
    row = {"id": "0", "task": "math", "answer": "5", "prompt": "2 + 3 = ?", "meta": {}}
    samples = [("5", True), ("4", False), ("4.0", False), ("5", True), ("4.00", False)]
    record = {"id": "0", "samples": [{"extracted": a, "correct": c, "tokens": 1} for a, c in samples]}
    assert summarize_sampled([record])["maj_at_k"]["5"] == 1.0  # as strings: 5 twice, each 4 once
    graded = summarize_sampled([record], classes=[answer_class(row)])["maj_at_k"]
    assert graded["4"] == 1.0 and graded["5"] == 0.0  # 2 against 2 (5 came first), then 2 against 3
