"""Eval summaries against numbers computed by hand on literal records."""

from __future__ import annotations

import pytest

from rung.config import EvalParams
from rung.eval.evaluate import summarize_greedy, summarize_sampled
from rung.eval.results import EvalResult, SetMetrics
from rung.report.pipeline import markdown


def _sample(answer, correct, tokens=10, truncated=False):
    return dict(
        completion="", extracted=answer, correct=correct, correct_lenient=correct, tokens=tokens, truncated=truncated
    )


RECORDS = [
    # prompt 1: samples A(right) A(right) B(wrong) -> c=2 of 3, majority A right
    dict(
        source="s1", task="t", difficulty="d1", samples=[_sample("A", True, 4), _sample("A", True), _sample("B", False)]
    ),
    # prompt 2: B(wrong) C(right) B(wrong) -> c=1 of 3, majority B wrong
    dict(
        source="s1",
        task="t",
        difficulty="d2",
        samples=[_sample("B", False, 8, True), _sample("C", True), _sample("B", False)],
    ),
    # prompt 3: no answer at all -> c=0
    dict(
        source="s2",
        task="u",
        difficulty="d2",
        samples=[_sample(None, False, 12, True), _sample(None, False), _sample(None, False)],
    ),
]


def test_greedy_summary_by_hand():
    m = summarize_greedy(RECORDS, EvalParams())
    assert m.n == 3 and m.accuracy == pytest.approx(1 / 3)  # only prompt 1's first sample is right
    assert m.format_rate == pytest.approx(2 / 3) and m.truncation_rate == pytest.approx(2 / 3)
    assert m.mean_tokens == pytest.approx(8) and m.median_tokens == 8
    assert m.accuracy_by_source == {"s1": 0.5, "s2": 0.0}
    assert m.accuracy_by_difficulty == {"d1": 1.0, "d2": 0.0} and m.accuracy_by_task == {"t": 0.5, "u": 0.0}
    assert m.accuracy_ci is not None
    lo, hi = m.accuracy_ci
    # the types as computed: statistics.mean of ints is an int, and the metrics file writes it so
    assert type(m.dump()["mean_tokens"]) is int and type(m.dump()["median_tokens"]) is int
    assert 0 <= lo <= 1 / 3 <= hi <= 1


def test_sampled_summary_by_hand():
    m = summarize_sampled(RECORDS)
    assert SetMetrics(n=3, accuracy=0.0, **m).avg_at_n() == {"avg@3": m["avg@3"]}
    assert m["avg@3"] == pytest.approx((2 / 3 + 1 / 3 + 0) / 3)
    # pass@1 = c/n averaged; pass@2 = 1 - C(n-c,2)/C(3,2): prompt1 1 - 0/3 = 1, prompt2 1 - 1/3, prompt3 0
    assert m["pass_at_k"]["1"] == pytest.approx(1 / 3)
    assert m["pass_at_k"]["2"] == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert m["pass_at_k"]["3"] == pytest.approx(2 / 3)  # k = n: 1 iff any correct
    # maj@3: prompt1 A (right), prompt2 B (wrong), prompt3 none (wrong)
    assert m["maj_at_k"]["3"] == pytest.approx(1 / 3)
    assert m["maj_at_k"]["1"] == pytest.approx(1 / 3)  # the first sample alone


def test_markdown_report_shows_interval_and_samples():
    greedy = summarize_greedy(RECORDS, EvalParams())
    metrics = EvalResult.model_validate(
        {
            "sampling": {"temperature": 0.0},
            "samples": {"n": 3, "temperature": 1.0, "top_p": 1.0},
            "sets": {
                "test": {**greedy.dump(), **summarize_sampled(RECORDS)},
                "ood": {**greedy.dump(), "accuracy": 0.25},
            },
        }
    )
    text = markdown({"base": metrics, "rl/main": metrics})
    assert "| rl/main | 33.3% [" in text and "avg@3" in text and "3 prompts" in text
