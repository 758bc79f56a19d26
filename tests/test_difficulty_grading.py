"""Difficulty is graded as the RL accuracy reward grades, and a stage whose curriculum reads pass
rates of another checkpoint than the one it starts from is warned about."""

from __future__ import annotations

import pytest
import yaml
from transformers import AutoTokenizer

import flows.difficulty
from flows.stage import preflight as stage_preflight
from rung import config
from rung.config import DifficultyParams, FormatParams, RLStageParams
from rung.data.difficulty import pass_rates, summarize
from rung.generate.completion import Completion, Generator
from rung.rl.rewards import Accuracy
from tests.rows import sums

FMT = FormatParams()
ROWS = sums(2, lambda i: 1)  # "Calculate 0 + 1." and "Calculate 1 + 1."
# Per row: the right answer in the format, the right number without it, a wrong answer in the format.
TEXTS = [["Answer: 1", "0 + 1 = 1", "Answer: 2"], ["1 + 1 = 2", "1 + 1 = 2", "Answer: 3"]]


def test_pass_rates_grade_as_the_accuracy_reward(tiny_model):
    answered = [[Completion(t, 3, False) for t in row] for row in TEXTS]
    gen = Generator(AutoTokenizer.from_pretrained(tiny_model), lambda prompts, *_, **__: answered)
    scores = pass_rates(gen, ROWS, FMT, DifficultyParams(num_generations=3), seed=0)
    reward = Accuracy(FMT, RLStageParams())
    for row, texts, s in zip(ROWS, TEXTS, scores, strict=True):
        k = len(texts)
        assert s["scores"] == reward(texts, [row["answer"]] * k, [row["task"]] * k, [row["prompt"]] * k, ["{}"] * k)
    assert [s["pass_rate"] for s in scores] == [pytest.approx(1 / 3), 0.0]
    assert [s["lenient_pass_rate"] for s in scores] == [pytest.approx(2 / 3), pytest.approx(2 / 3)]
    assert [s["bucket"] for s in scores] == ["medium", "unsolved"]
    stats = summarize(scores, kept=2)
    assert stats["mean_pass_rate"] == pytest.approx(1 / 6) and stats["mean_lenient_pass_rate"] == pytest.approx(2 / 3)


def _warned(caplog, default_params: dict, **edits: object) -> list[str]:
    data = yaml.safe_load(yaml.safe_dump(default_params))
    for key, value in edits.items():
        section, field = key.split("__")
        (data[section] if section == "difficulty" else data["rl"]["stages"]["main"])[field] = value
    caplog.clear()
    with caplog.at_level("WARNING", logger="rung.checks"):
        stage_preflight(config.parse(data), flows.difficulty.CHECKS)
    return [r.getMessage() for r in caplog.records if r.name.startswith("rung.checks")]


def test_difficulty_reference_is_checked_against_the_rl_start(default_params, caplog):
    assert _warned(caplog, default_params) == []  # the default: reference sft, RL from sft
    assert _warned(caplog, default_params, difficulty__reference="base") == [
        "difficulty.reference: base, but rl.stages.main (init: sft) starts from another checkpoint: "
        "its pass rates are not its policy's"
    ]
    # pass rates unread (uniform curriculum, no buckets, the whole window): nothing to warn about
    uniform = {"type": "uniform"}
    assert _warned(caplog, default_params, difficulty__reference="base", main__curriculum=uniform) == []
    assert len(_warned(caplog, default_params, difficulty__reference="base", main__buckets=["hard"])) == 1
