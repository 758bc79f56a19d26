"""Evaluation metrics against values worked out by hand and against the naive binomial formula."""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binomtest

from rung.answers import verify
from rung.eval.evaluate import summarize_sampled
from rung.eval.metrics import (
    avg_at_n,
    bootstrap_ci,
    maj_at_k,
    maj_at_ks,
    mean_pass_at_k,
    pass_at_k,
    share_interval,
)


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 1, 0.4),  # 1 - C(3,1)/C(5,1) = 1 - 3/5; product: 1 - (1 - 1/4)(1 - 1/5) = 1 - 0.6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10; product: 1 - (1 - 2/4)(1 - 2/5) = 1 - 0.3
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (10, 0, 5, 0.0),  # no correct sample: empty product, 1 - 1
        (10, 10, 1, 1.0),  # all correct
        (5, 0, 5, 0.0),  # k = n and c = 0
        (5, 1, 5, 1.0),  # k = n and c > 0: the one correct sample is always drawn
        (5, 3, 3, 1.0),  # n - c = 2 < k = 3: any 3 of the 5 include a correct one
        (1000, 1, 100, 0.1),  # C(999,100)/C(1000,100) = (1000-100)/1000 = 0.9
    ],
)
def test_pass_at_k_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_naive_formula_on_a_grid():
    for n in range(1, 13):
        for c in range(n + 1):
            for k in range(1, n + 1):
                naive = 1 - math.comb(n - c, k) / math.comb(n, k)  # math.comb(m, k) is 0 when k > m
                assert pass_at_k(n, c, k) == pytest.approx(naive, abs=1e-12), (n, c, k)


def test_pass_at_k_large_n_where_float_binomials_overflow():
    n, c, k = 2000, 3, 500
    with pytest.raises(OverflowError):  # C(2000, 500) ~ 1e486 is beyond a double
        float(math.comb(n - c, k)) / float(math.comb(n, k))
    # C(n-c,k)/C(n,k) = prod_{i<c} (n-k-i)/(n-i) = (1500 * 1499 * 1498) / (2000 * 1999 * 1998)
    exact = 1 - Fraction(1500 * 1499 * 1498, 2000 * 1999 * 1998)
    assert exact == 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize("n, c, k, arg", [(5, 2, 0, "k"), (5, 2, 6, "k"), (5, -1, 1, "c"), (5, 6, 1, "c")])
def test_pass_at_k_rejects_bad_arguments(n, c, k, arg):
    with pytest.raises(ValueError, match=rf"^{arg} must"):
        pass_at_k(n, c, k)


def test_mean_pass_at_k():
    # pass@2 with n=5 for c = 0, 2, 5: (0 + 0.7 + 1) / 3
    assert mean_pass_at_k([0, 2, 5], n=5, k=2) == pytest.approx(1.7 / 3)
    with pytest.raises(ValueError):
        mean_pass_at_k([], n=5, k=2)


def test_avg_at_n_weighs_prompts_equally():
    # per prompt 1/4 and 2/2 -> (0.25 + 1) / 2 = 0.625, not the pooled 3/6
    assert avg_at_n([[True, False, False, False], [True, True]]) == pytest.approx(0.625)
    with pytest.raises(ValueError):
        avg_at_n([[True], []])


@pytest.mark.parametrize(
    "answers, voted",
    [
        (["4", "3", "3"], "3"),
        (["3", " 4", "4 ", None, "3"], "3"),  # 3 and 4 both twice after stripping: 3 came first
        ([" 4", "3", "4 ", "3"], "4"),  # same tie, other order
        ([None, "  ", None], None),  # nothing but missing or blank answers
        ([" 7 "], "7"),
    ],
)
def test_majority_vote(answers, voted):
    k = len(answers)
    for right in {voted, *(a.strip() for a in answers if a and a.strip())} - {None}:  # each answer the right one
        samples = [(a, a is not None and a.strip() == right) for a in answers]
        assert maj_at_k([samples], k) == float(right == voted)
    assert maj_at_k([[(a, False) for a in answers]], k) == 0.0


def test_maj_at_k():
    samples = [
        [("2", True), ("3", False), ("2 ", True)],  # votes 2: correct
        [("5", False), ("5", False), ("6", True)],  # votes 5: wrong though one sample was right
        [(None, False), (None, False), ("1", True)],  # votes 1 only when the third sample is in
    ]
    assert maj_at_k(samples, k=3) == pytest.approx(2 / 3)
    # first two samples: tie 2/3 -> 2 (correct); 5 (wrong); no answer (wrong)
    assert maj_at_k(samples, k=2) == pytest.approx(1 / 3)
    assert maj_at_k(samples, k=1) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="only 3 samples"):
        maj_at_k(samples, k=4)
    assert maj_at_ks(samples, [3, 1, 2]) == {1: pytest.approx(1 / 3), 2: pytest.approx(1 / 3), 3: pytest.approx(2 / 3)}


def _many_wrong(right: str, wrong: list[str]) -> list[tuple[str, bool]]:
    """256 samples: each of `wrong` once and its first 20 again, the rest `right`, shuffled (seeded)."""
    samples = [(right, True)] * (256 - len(wrong) - 20) + [(a, False) for a in wrong + wrong[:20]]
    random.Random(0).shuffle(samples)
    return samples


def test_maj_at_k_classifies_each_distinct_answer_once():
    """Voting used to compare each new wrong answer with one answer of every class so far: at n = 256
    with 161 distinct wrong answers, 12,880 grader calls for one prompt. Now each is classified once."""
    wrong = [str(i) for i in range(1, 162)]
    samples = _many_wrong("0", wrong)
    calls: Counter[str] = Counter()

    def parity(answer: str) -> int:  # a grader for which the wrong answers are two answers, odd and even
        calls[answer] += 1
        return int(answer) % 2

    assert maj_at_k([samples], 256, [parity]) == 0.0  # 91 odd votes, 90 even, 75 right
    assert sorted(calls) == sorted(wrong) and set(calls.values()) == {1}  # 161 calls, not 12,880
    assert maj_at_k([samples], 256) == 1.0  # as strings: 75 right against at most 2 for any wrong one


def test_maj_at_k_of_math_parses_each_answer_once(monkeypatch):
    """The same prompt graded by math-verify: one parse per distinct wrong answer, none compared with another."""
    row = {"id": "0", "task": "math", "answer": "\\frac{1}{2}", "prompt": "?", "meta": {}}
    # expressions: a single number is classed by its value without math-verify (rung.answers.numbers)
    wrong = [f"\\frac{{{k}}}{{7}}x" if k % 3 else f"\\sqrt{{{k}}}" for k in range(1, 162)]
    record = {
        "id": "0",
        "samples": [{"extracted": a, "correct": ok, "tokens": 1} for a, ok in _many_wrong("0.5", wrong)],
    }
    parsed: Counter[str] = Counter()
    parse = verify.parse_math
    monkeypatch.setattr(verify, "parse_math", lambda a: parsed.update([a]) or parse(a))
    maj = summarize_sampled([record], classes=[verify.answer_class(row)])["maj_at_k"]
    assert maj["256"] == 1.0 and sorted(parsed) == sorted(wrong) and set(parsed.values()) == {1}


def test_an_answer_class_is_the_graders_equivalence():
    half = verify.answer_class({"task": "math", "answer": "3"})
    assert len({half(a) for a in ["0.5", "1/2", "\\frac{1}{2}", "\\dfrac12", "0.50", "$\\frac{2}{4}$"]}) == 1
    assert half("x = 5") == half("5") == half("5.0") and half("\\sqrt{2}") == half("1.414214") == half("2^{1/2}")
    assert half("\\{0.5, 1\\}") == half("\\{1, \\frac{1}{2}\\}") and half("x + 1") == half("1 + x")
    assert len({half(a) for a in ["1/2", "0.51", "1/3", "-1/2", "x/2", "(1, 2)", "\\{1, 2\\}"]}) == 7
    pairs = [("0.5", "\\frac{1}{2}"), ("x = 5", "5"), ("\\sqrt{2}", "1.414214"), ("0.5", "0.51"), ("1", "x")]
    for a, b in pairs:  # one class exactly when math-verify grades one right against the other
        assert verify.is_correct(a, {"task": "math", "answer": b, "meta": {}}) == (half(a) == half(b))
    # reasoning-gym: chain_sum's scorer reads numbers ("+05" is 5); the default scorer compares strings
    chain = verify.answer_class({"task": "chain_sum", "answer": "1", "prompt": "?", "meta": {}})
    assert chain("5") == chain("+05") == chain("5.0") != chain("6")
    exact = verify.answer_class({"task": "basic_arithmetic", "answer": "1", "prompt": "?", "meta": {}})
    # a number in a standard form is that number in every task, also under the default (string) scorer
    assert exact("5") == exact("5.0") == exact("+5") != exact("6") and exact("5 or 6") != exact("5")
    assert verify.is_correct("5", {"task": "basic_arithmetic", "answer": "5.0", "prompt": "?", "meta": {}}) is True


def test_bootstrap_ci_is_deterministic_and_contains_the_mean():
    values = [1.0] * 30 + [0.0] * 70
    ci = bootstrap_ci(values, seed=7)
    assert ci == bootstrap_ci(values, seed=7)
    assert ci != bootstrap_ci(values, seed=8)
    lo, hi = ci
    assert lo < 0.3 < hi
    # normal approximation: 0.3 +- 1.96 * sqrt(0.3 * 0.7 / 100) = 0.3 +- 0.09
    assert hi - lo == pytest.approx(0.18, abs=0.03)
    assert bootstrap_ci([2.0] * 5) == (2.0, 2.0)


def test_bootstrap_ci_narrows_with_more_data():
    small = bootstrap_ci([1.0] * 30 + [0.0] * 70)
    large = bootstrap_ci([1.0] * 300 + [0.0] * 700)
    # the width shrinks like 1/sqrt(n): ten times the data, about a third of the width
    assert large[1] - large[0] < (small[1] - small[0]) / 2


def test_bootstrap_ci_rejects_bad_arguments():
    for kwargs in ({"values": []}, {"values": [1.0], "confidence": 1.0}, {"values": [1.0], "resamples": 0}):
        with pytest.raises(ValueError):
            bootstrap_ci(**kwargs)


def test_share_interval_is_clopper_pearson_for_right_and_wrong():
    for right, n in [(0, 50), (3, 50), (147, 305), (8, 8)]:
        exact = binomtest(right, n).proportion_ci(0.95, method="exact")
        low, high = share_interval([1.0] * right + [0.0] * (n - right), 0.95)
        assert (float(low), float(high)) == pytest.approx((exact.low, exact.high), abs=1e-9)


def test_share_interval_stays_open_at_the_boundary():
    # an arm with every prompt solved (the study printed "dapo 100.0 [100.0, 100.0]"): a lower bound below 100%,
    # at most Clopper-Pearson's for as many 0/1 prompts; values all alike still leave room for a missed prompt
    low, high = share_interval([1.0] * 8)
    assert high == 1 and low == pytest.approx(0.025 ** (1 / 8))
    low, high = share_interval([0.0] * 8, weights=[3.0] * 8)  # 8 prompt clusters of 3 seeds each: 8 prompts
    assert low == 0 and high == pytest.approx(1 - 0.025 ** (1 / 8))
    low, high = share_interval([0.5] * 50)
    assert 0.4 < low < 0.5 < high < 0.6
    # values that vary less than 0/1 ones give a narrower interval than the share of right answers
    narrow, wide = share_interval([0.5, 0.4] * 25), share_interval([1.0, 0.0] * 25)
    assert wide[0] < narrow[0] < 0.45 < narrow[1] < wide[1]


def test_share_interval_is_vectorised_and_rejects_bad_input():
    rows = np.array([[1.0, 0.5, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    low, high = share_interval(rows)
    assert [float(low[1]), float(high[1])] == [pytest.approx(float(share_interval(rows[1])[0])), 1.0]
    assert float(low[0]) == pytest.approx(float(share_interval(rows[0])[0]))
    for values, kwargs in (([], {}), ([1.2], {}), ([0.5], {"confidence": 1.0}), ([0.5, 1], {"weights": [1.0]})):
        with pytest.raises(ValueError):
            share_interval(values, **kwargs)
