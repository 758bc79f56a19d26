"""Degenerate experiments say so: rung.report.health's checks, and the report listing what they found."""

from __future__ import annotations

from rung import models
from rung.config import FormatParams
from rung.eval.results import EvalResult
from rung.report import health, pipeline
from rung.train.sft import truncated_fraction


def test_each_degenerate_sign_is_named():
    assert health.warnings("sft", {"truncated_fraction": 0.39}) == [
        "sft: 39% of SFT examples are longer than sft.max_length and were truncated"
    ]
    assert health.warnings("sft", {"truncated_fraction": 0.1}) == []
    assert health.warnings("difficulty", {"solved_fraction": 0.95, "unsolved_fraction": 0.0})[0].startswith(
        "difficulty: 95% of prompts are solved"
    )
    assert health.warnings("rl-main", {"frac_reward_zero_std": 0.64}) == [
        "rl-main: 64% of generated groups had zero reward variance (no gradient)"
    ]
    assert health.warnings("eval-base", {"sets": {"test": {"format_rate": 0.0}, "ood": {"format_rate": 0.5}}}) == [
        "eval-base: the model never follows the answer format on test (format rate 0%)"
    ]
    assert health.warnings("curate", {"train": 3}) == []


def test_sft_truncation_is_measured_on_the_templated_example(tiny_model):
    tok = models.load_tokenizer(tiny_model)
    traces = [{"prompt": "1 + 1?", "target": "Answer: 2"}, {"prompt": "long " * 200, "target": "Answer: 3"}]
    assert truncated_fraction(traces, FormatParams(), tok, max_length=128) == 0.5


def test_the_report_lists_the_warnings(tmp_path):
    evals = {
        "base": EvalResult.model_validate(
            {
                "sets": {
                    "test": {
                        "accuracy": 0.0,
                        "accuracy_lenient": 0.1,
                        "format_rate": 0.0,
                        "mean_tokens": 9.0,
                        "truncation_rate": 0.0,
                        "n": 4,
                        "accuracy_by_source": {},
                    }
                },
                "sampling": {"temperature": 0.0},
            }
        )
    }
    text = pipeline.markdown(
        evals, warnings=["eval-base: the model never follows the answer format on test (format rate 0%)"]
    )
    assert "Warnings (rung.health):" in text and "- eval-base: the model never follows" in text
    pipeline.html(
        evals, {}, {}, tmp_path / "r.html", warnings=["rl-main: 64% of generated groups had zero reward variance"]
    )
    assert '<section id="warnings">' in (tmp_path / "r.html").read_text()
