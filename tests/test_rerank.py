"""Best-of-N in evaluation (rung.eval.rerank): best-of-k and weighted maj@k picks on scripted samples and
scores (ties included), beside maj@k and pass@k on the same samples with the paired test of best-of-n against
maj@n, the eval flow on the tiny model reranking with a random reward model and PRM, and the
refusals before any compute."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import cast

import pytest
import yaml

from rung import config, files, models, preflight
from rung.checks import rerank as checks
from rung.config import ConfigError, FormatParams
from rung.errors import InputError
from rung.eval import evaluate, rerank
from rung.eval.paired import mcnemar_interval
from rung.eval.results import EvalRecord, EvalResult, SetMetrics
from rung.report import keys
from rung.report.pipeline import markdown
from tests.rows import sums

FMT = FormatParams()


def record(answers: list[str | None], right: str) -> EvalRecord:
    samples = [{"completion": f"Answer: {a}", "extracted": a, "correct": a == right, "tokens": 3} for a in answers]
    return EvalRecord(id=right, prompt="p", samples=samples)  # type: ignore[typeddict-item]


# four prompts of 4 samples, the right answer second; the comment says what each method picks at k = 4
RECORDS = [
    record(["5", "5", "7", "9"], "7"),  # maj: 5 (wrong); best: 7 (3); weighted: 7 (.95 > 2 x .27): right
    record(["3", "2", "2", None], "2"),  # best: tie at 4, the earlier 3 (wrong); maj and weighted: 2 (right)
    record(["4", "6", "4", "6"], "6"),  # all tie: the first sample, the first class, 4 (wrong) for every method
    record(["8", "8", "8", "8"], "8"),  # right whatever the scores
]
SCORES = [[-1, -1, 3, 1], [4, 4, 0, -2], [0, 0, 0, 0], [-5, 2, 0, 1]]


def test_best_of_and_weighted_majority_pick_by_hand_ties_to_the_earlier():
    assert rerank.best_of([1, 3, 3, 0], [False, False, True, True], [1, 2, 3, 4]) == [False, False, False, False]
    assert rerank.best_of([1, 3, 5, 5], [False, False, True, False], [3, 4]) == [True, True]
    assert rerank.sigmoid(0) == 0.5 and rerank.sigmoid(1000) == 1.0 and rerank.sigmoid(-1000) == 0.0
    found = rerank.summarize(RECORDS, SCORES, [1, 2, 4], None, 0.95)
    assert found.best_of_k == {"1": 0.25, "2": 0.25, "4": 0.5}
    # k = 2: prompt 1's 3 and 2 weigh sigmoid(4) each, a tie that the first class (3, wrong) wins
    assert found.weighted_maj_at_k == {"1": 0.25, "2": 0.25, "4": 0.75}
    # on the same samples: maj@4 0.5 (prompts 1 and 3), pass@4 1.0
    sampled = evaluate.summarize_sampled(RECORDS, compare_k=[2])
    assert sampled["maj_at_k"]["4"] == 0.5 and sampled["pass_at_k"]["4"] == 1.0
    # best-of-4 against maj@4: prompt 0 wrong -> right, prompt 1 right -> wrong
    test = found.versus_maj
    assert (test.right_to_wrong, test.wrong_to_right, test.both_right, test.both_wrong) == (1, 1, 1, 1)
    assert (test.accuracy_old, test.accuracy_new, test.mcnemar_p) == (0.5, 0.5, 1.0)
    assert (test.difference, test.ci_low, test.ci_high) == pytest.approx(mcnemar_interval(1, 1, 4, 0.95))
    assert test.verdict == "not significant at 0.05 (exact McNemar)" and test.prompts_needed is None


def test_a_clear_reranker_is_significant_against_majority_and_the_metrics_file_round_trips():
    # 30 prompts where the majority is wrong and the one right sample scores highest: 30 flips wrong -> right
    records = [record(["1", "1", "2", "1"], "2") for _ in range(30)]
    found = rerank.summarize(records, [[0, 0, 1, 0]] * 30, [1, 2, 4], None, 0.95)
    test = found.versus_maj
    assert found.best_of_k["4"] == 1.0 and found.weighted_maj_at_k["4"] == 0.0  # 3 x .5 outweighs .73
    assert test.wrong_to_right == 30 and test.mcnemar_p == pytest.approx(2 * 0.5**30) and test.significant
    assert test.ci_low > 0.8 and test.ci_high == 1.0
    m = SetMetrics(n=30, accuracy=0.0, rerank={"reward_model": found})
    assert SetMetrics.model_validate(m.dump()).dump() == m.dump()
    logged = keys.metric_keys(m.flat(), "test")
    assert logged["test/rerank/reward_model/best_of_4"] == 1.0
    assert logged["test/rerank/reward_model/weighted_maj_at_2"] == 0.0
    assert logged["test/rerank/reward_model/versus_maj/mcnemar_p"] == test.mcnemar_p
    shown = dict.fromkeys(["accuracy_lenient", "format_rate", "mean_tokens", "truncation_rate"], 0.0)
    sampled = {"maj_at_k": {"4": 0.0}, "pass_at_k": {"4": 1.0}, **shown}
    report = markdown({"sft": EvalResult(sets={"test": SetMetrics(**m.dump(), **sampled)})})
    assert (
        "| sft | test | reward_model | 4 | 0.0% | 100.0% | 100.0% | 0.0% | +100.0 [+81.7, +100.0] | < 0.001 | "
        "significant at 0.05 (exact McNemar) |" in report
    )


def _rerankers(tiny_model: Path, out: Path) -> dict[str, Path]:
    """Random-init reward model (sequence classification, one label) and PRM (token classification and its
    settings) of the tiny model: no training, what matters is that eval scores with them."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    from rung.rewardmodels.scoring import SETTINGS

    tok = models.load_tokenizer(tiny_model)
    dirs = {"reward_model": out / "rm", "process_reward_model": out / "prm"}
    for kind, cls in (("reward_model", AutoModelForSequenceClassification), ("process_reward_model", None)):
        model = (cls or AutoModelForTokenClassification).from_pretrained(tiny_model, num_labels=1)
        model.config.pad_token_id = tok.pad_token_id or tok.eos_token_id
        model.save_pretrained(dirs[kind])
        tok.save_pretrained(dirs[kind])
    files.write_json(dirs["process_reward_model"] / SETTINGS, {"splitter": "\n", "format": FMT.model_dump()})
    return dirs


def test_validate_refuses_a_reranker_in_one_line_naming_the_key(tiny_model, tmp_path, default_params, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _rerankers(tiny_model, tmp_path)
    shutil.copytree(tiny_model, "causal")

    def refused(rerank: dict, **sections) -> str:
        samples = {**default_params["eval"]["samples"], "rerank": rerank}
        with pytest.raises((ConfigError, InputError)) as e:
            preflight.check(config.parse({**default_params, **sections, "eval": {"samples": samples}}))
        assert "\n" not in str(e.value)
        return str(e.value)

    key = "eval.samples.rerank"
    assert refused({}).endswith(
        f"{key}.reward_model: name a reward model or a process_reward_model to rerank with (or drop rerank)"
    )
    assert (
        refused({"reward_model": "rm2"})
        == f"{key}.reward_model: 'rm2' is no reward_models stage (have []) and no directory"
    )
    assert refused({"reward_model": "causal"}).startswith(f"{key}.reward_model: causal is not a reward model")
    assert refused({"reward_model": "prm"}).startswith(f"{key}.reward_model: prm is not a reward model")  # a PRM
    assert refused({"process_reward_model": "rm"}) == (
        f"{key}.process_reward_model: rm is not a process reward model (no process_reward_model.json)"
    )
    assert refused({"reward_model": "rm"}, environment={"name": "retry"}).startswith(f"{key}: reranks single-turn")
    # a stage of the section is enough (it writes the checkpoint); its directory must be a dep of the evals
    params = config.parse(
        {**default_params, "reward_models": {"rm": {}}, "eval": {"samples": {"rerank": {"reward_model": "rm"}}}}
    )
    preflight.check(params)
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"eval_sft": {"deps": ["flows/eval.py"]}}}))
    with pytest.raises(
        InputError, match=r"^eval.samples.rerank: data/models/reward_models/rm is what dvc.yaml's eval_sft"
    ):
        checks.listed(tmp_path / "params.yaml", params)
    dag = {"stages": {"eval_sft": {"deps": ["data/models/reward_models/rm"]}}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(dag))
    checks.listed(tmp_path / "params.yaml", params)
    assert checks.given(params) == [] and checks.deps(params, tmp_path)["eval_rl"] == ["data/models/reward_models/rm"]
    with pytest.raises(InputError, match="outside the project"):
        checks.deps(config.parse({**default_params, "eval": {"samples": {"rerank": {"reward_model": "/x"}}}}), tmp_path)


def test_the_eval_flow_reranks_with_a_stage_and_a_directory(tiny_model, tmp_path, default_params, monkeypatch):
    """flows.eval end to end on the tiny model: a `reward_models` stage's directory and a PRM directory rerank its
    samples; the metrics file, the samples file and the MLflow run hold the reranked numbers."""
    import mlflow
    from prefect.testing.utilities import prefect_test_harness

    import flows.eval
    from rung import paths

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    dirs = _rerankers(tiny_model, tmp_path)
    shutil.copytree(dirs["reward_model"], paths.learned_reward("reward_models", "rm"))
    shutil.copytree(tiny_model, paths.SFT)
    files.write_jsonl(paths.TEST, sums(3, lambda i: 2))
    rerank_with = {"reward_model": "rm", "process_reward_model": "prm", "aggregate": "mean"}
    samples = {"n": 2, "temperature": 1.0, "max_new_tokens": 4, "max_prompts": 2, "rerank": rerank_with}
    evals = {"sampling": {"temperature": 0.0, "max_new_tokens": 4}, "samples": samples, "sets": []}
    params = {**default_params, "eval": evals, "reward_models": {"rm": {}}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with prefect_test_harness(server_startup_timeout=180):
        flows.eval.eval_checkpoint("sft", "params.yaml")
    test = files.read_json(paths.metrics("eval-sft"))["sets"]["test"]
    assert set(test["rerank"]) == {"reward_model", "process_reward_model"}
    assert test["rerank"]["reward_model"]["versus_maj"]["accuracy_old"] == test["maj_at_k"]["2"]
    kept = cast(list[EvalRecord], files.read_jsonl(paths.EVAL / "sft" / "test.samples.jsonl"))
    for kind, found in test["rerank"].items():  # the numbers are those of the scores the samples file keeps
        assert (
            rerank.summarize(kept, [[s["scores"][kind] for s in r["samples"]] for r in kept], [1, 2], None, 0.95).dump()
            == found
        )
    (run,) = [
        r
        for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
        if r.info.run_name == "eval@sft"
    ]
    assert (
        run.data.metrics["test/rerank/process_reward_model/best_of_2"]
        == test["rerank"]["process_reward_model"]["best_of_k"]["2"]
    )
    assert run.data.tags["md5.rerank.reward_model"] == files.md5(paths.learned_reward("reward_models", "rm"))
