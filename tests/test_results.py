"""Typed results (rung.eval.results) write the files they replaced byte for byte: every eval metrics
file read and dumped again, and the report's and a study's files against the ones the dict-based
code wrote for the same inputs (tests/fixtures/report, written before the results were typed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rung import files
from rung.eval import comparisons
from rung.eval.results import Comparisons, EvalResult, StudyResult
from rung.report import pipeline, study, studypage
from tests.records import study_run, write_evaluated

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests/fixtures/report"
CHECKPOINTS = {"base": "base", "sft": "sft", "rl/main": "rl-main"}
RL = {
    "main": {
        "init": "sft",
        "recipe": "grpo, dapo: dapo loss, clip 0.2/0.28, beta 0.0",
        "curriculum": "pools + dynamic sampling (3 rounds)",
        "steps": "20 x 2 prompts x 8, lr 3e-06",
        "zero-variance groups": "0.15 generated, 0.00 trained; 0.00 of generated groups dropped, 0 extra completions",
        "last reward": "0.787 trained on",
    }
}


def _bytes(obj: object) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n"  # as rung.files.write_json writes


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("eval-*.json")), ids=lambda p: p.name)
def test_eval_metrics_files_round_trip(path):
    text = path.read_text()
    assert _bytes(EvalResult.model_validate_json(text).dump()) == text


def test_report_files_are_the_ones_written_before(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_evaluated(tmp_path, "chain_sum_4terms")
    compared = comparisons.comparisons(comparisons.pairs({"main": "sft"}), 0.95, 300, 42)
    evals = {
        c: EvalResult.model_validate(files.read_json(FIXTURES / f"eval-{slug}.json")) for c, slug in CHECKPOINTS.items()
    }
    curves = {"rl/main": [{"step": 1, "reward": 0.5}]}
    warnings = ["eval-base: the model never follows the answer format on test (format rate 0%)"]
    text = pipeline.run(evals, curves, RL, {"seed": 42, "model": "m"}, compared, warnings)
    assert (tmp_path / "data/reports/comparisons.json").read_text() == (FIXTURES / "comparisons.json").read_text()
    assert text == (tmp_path / "data/reports/report.md").read_text() == (FIXTURES / "report.md").read_text()
    assert Comparisons.model_validate_json((FIXTURES / "comparisons.json").read_text()) == compared


def test_study_files_are_the_ones_written_before(tmp_path):
    spec = study.Study(name="t", seeds=[1, 2], arms={"a": {}, "b": {}, "c": {}})
    runs = [
        study_run("a", 1, 0.25, [True, False, False, False], ood=True),
        study_run("a", 2, 0.5, [True, True, False, False], ood=True),
        study_run("b", 1, 0.5, [True, True, False, False], ood=True),
        study_run("b", 2, 0.75, [True, True, True, False], ood=True),
        study_run("c", 1, 1.0, [True, True, True, True], ood=True),
        study_run("c", 2, 0.75, [True, True, True, False], ood=True),
    ]
    result = study.aggregate(spec, runs, 0.95, 200, 0)
    written = studypage.write(result, {"seeds": "1, 2"}, tmp_path)
    assert written["json"].read_text() == (FIXTURES / "study.json").read_text()
    assert written["md"].read_text() == (FIXTURES / "study.md").read_text()
    before = json.loads((FIXTURES / "study.json").read_text())
    before.pop("settings")
    assert StudyResult.model_validate(before) == result
