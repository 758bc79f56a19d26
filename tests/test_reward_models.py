"""The learned-reward stages on the tiny model: pairs from verifier-graded samples and from files, AUROC, a
reward model and an ensemble that learn a separable toy task, Monte-Carlo step labels, a process reward model
that learns one, resume of each to what an unkilled run trains, the refusals before any compute, and each
stage's flow from params to metrics under Prefect and MLflow."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from transformers import TrainerCallback

from rung import config, files, models, paths
from rung.config import ConfigError, FormatParams, ProcessRewardModelParams, RewardModelParams, VerifierPairs
from rung.errors import InputError
from rung.generate.completion import Completion, Generator
from rung.rewardmodels import heldout, metrics, pairs, scoring, steps
from rung.rewardmodels.scoring import ProcessRewardModel
from rung.train import launch
from rung.train.jobs import ProcessRewardModelJob, RewardModelJob
from tests.rows import sums
from tests.tiny_model import job

FMT = FormatParams()


@pytest.fixture(autouse=True)
def _mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


def scripted(tok, texts: dict[str, list[str]]) -> Generator:
    """A generator that answers each prompt (found by a key its decoded text holds) with its scripted texts."""

    def generate(prompts, sampling, n, seed, desc):
        out = []
        for p in prompts:
            text = tok.decode(p)
            found = next(v for k, v in texts.items() if k in text)
            out.append([Completion(t, 4, False) for t in (found * n)[:n]])
        return out

    return Generator(tok, generate)


def test_auroc_is_sklearns_and_the_hand_computed_value():
    # right scores 0.9, 0.4; wrong 0.4, 0.1: of 4 (right, wrong) pairs 3 ordered, 1 tied -> 3.5 / 4
    assert metrics.auroc([0.9, 0.4, 0.4, 0.1], [True, True, False, False]) == 0.875
    assert metrics.auroc([1.0, 2.0], [True, True]) is None
    sk = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    scores = [rng.choice([0.0, 0.5, 1.0]) + rng.random() * (i % 3) for i in range(200)]
    right = [rng.random() < 0.4 for _ in scores]
    assert metrics.auroc(scores, right) == pytest.approx(sk.roc_auc_score(right, scores))
    assert metrics.pairwise_accuracy([1, 2, 3], [0, 2, 4]) == pytest.approx(0.5)
    by = metrics.auroc_by_bucket([0.9, 0.1, 0.5, 0.7], [True, False, True, True], ["easy", "easy", "hard", "hard"])
    assert by == {"easy": 1.0}  # hard has no wrong completion: no AUROC
    assert metrics.pairwise_accuracy_by_bucket([1, 2, 3], [0, 2, 4], ["a", "a", "b"]) == {"a": 0.75, "b": 0.0}


def test_pairs_are_a_right_and_a_wrong_completion_of_one_prompt(tiny_model):
    rows = sums(3, lambda i: 2, graded=True)  # answers 2, 3, 4
    gen = scripted(
        models.load_tokenizer(tiny_model),
        {
            "0 + 2": ["Answer: 2", "Answer: 5", "Answer: 2", "Answer: 7"],  # 2 right, 2 wrong
            "1 + 2": ["Answer: 3"],  # all right: no pair
            "2 + 2": ["Answer: 0"],  # all wrong: no pair
        },
    )
    params = VerifierPairs(samples_per_prompt=4, pairs_per_prompt=3)
    graded = pairs.graded(gen, rows, FMT, params, seed=0)
    assert [c["right"] for c in graded[0]["completions"]] == [True, False, True, False]
    made, stats = pairs.from_graded(graded, params, seed=0)
    assert stats == {"prompts": 3, "prompts_no_right": 1, "prompts_no_wrong": 1, "pairs": 3}
    assert all(
        p["id"] == "0"
        and p["bucket"] == "unsolved"
        and p["chosen"] == "Answer: 2"
        and p["rejected"] in ("Answer: 5", "Answer: 7")
        for p in made
    )
    ordered, _ = pairs.from_graded(graded, params.model_copy(update={"choose": "all"}), seed=0)
    assert [(p["chosen"], p["rejected"]) for p in ordered] == [
        ("Answer: 2", "Answer: 5"),
        ("Answer: 2", "Answer: 7"),
    ] + [("Answer: 2", "Answer: 5")]
    train, held = pairs.split(graded, 0.34, seed=0, key="k")
    assert len(held) == 1 and {r["id"] for r in train}.isdisjoint(r["id"] for r in held)


def test_pairs_from_a_jsonl_file_and_a_dataset_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"p{i}", "chosen": "good", "rejected": "bad"} for i in range(3)]
    files.write_jsonl("prefs.jsonl", rows)
    got = pairs.read(config.PreferenceFile(path="prefs.jsonl"), "reward_models.rm.pairs")
    assert [p["id"] for p in got] == ["0", "1", "2"] and got[0]["chosen"] == "good"
    # a dataset directory is read by the same datasets.load_dataset call as a hub id
    files.write_jsonl("prefs_dir/train.jsonl", rows[:2])
    assert len(pairs.read(config.PreferenceFile(path="prefs_dir"), "k")) == 2
    files.write_jsonl("bad.jsonl", [{"prompt": "p", "chosen": "x"}])
    with pytest.raises(
        InputError, match=r"^reward_models.rm.pairs.path: bad.jsonl row 0 has no text in column\(s\) rejected$"
    ):
        pairs.read(config.PreferenceFile(path="bad.jsonl"), "reward_models.rm.pairs")


def separable(count: int) -> list[dict[str, str]]:
    """Pairs a model tells apart by their last word alone: chosen ends in 'right', rejected in 'wrong'."""
    return [
        {"id": str(i), "prompt": f"Calculate {i} + 2.", "chosen": f"{i + 2} right", "rejected": f"{i + 3} wrong"}
        for i in range(count)
    ]


class CrashAt2(TrainerCallback):
    """Stops training right after checkpoint-2 is written, like a killed job."""

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == 2:
            raise KeyboardInterrupt


def _rm_job(tiny_model: Path, work: Path, data: Path, **kw) -> RewardModelJob:
    params = RewardModelParams(max_steps=4, save_steps=2, learning_rate=1e-3, per_device_train_batch_size=4)
    return job(RewardModelJob, tiny_model, data, work, key="reward_models.rm", params=params, seed=1, **kw)


def _assert_same_weights(a: Path, b: Path, auto) -> None:
    x, y = auto.from_pretrained(a), auto.from_pretrained(b)
    for p, q in zip(x.state_dict().values(), y.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q)


def test_a_killed_reward_model_resumes_to_what_an_unkilled_one_trains(tiny_model, tmp_path):
    from transformers import AutoModelForSequenceClassification

    data = tmp_path / "pairs.jsonl"
    files.write_jsonl(data, separable(16))
    launch.train(_rm_job(tiny_model, tmp_path / "whole", data), launch.LaunchParams(), tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        launch.train(
            _rm_job(tiny_model, tmp_path / "cut", data, callbacks=["tests.test_reward_models:CrashAt2"]),
            launch.LaunchParams(),
            tmp_path / "b",
        )
    resumed = launch.train(_rm_job(tiny_model, tmp_path / "cut", data), launch.LaunchParams(), tmp_path / "b")
    assert resumed["steps"] == 4
    _assert_same_weights(tmp_path / "a", tmp_path / "b", AutoModelForSequenceClassification)
    scoring.check(tmp_path / "a", "k")  # a standard sequence-classification checkpoint with one label
    with pytest.raises(
        InputError, match=r"^rl.stages.main.rewards.rm: .* is not a reward model \(a sequence-classification"
    ):
        scoring.check(tiny_model, "rl.stages.main.rewards.rm")


def test_steps_split_after_the_splitter_and_join_back():
    text = "2 + 3 = 5\n\n5 * 2 = 10\nAnswer: 10"
    assert steps.split(text, "\n") == ["2 + 3 = 5\n\n", "5 * 2 = 10\n", "Answer: 10"]
    assert "".join(steps.split(text, r"\.\s|\n")) == text
    assert steps.split("one. two. three", r"\. ") == ["one. ", "two. ", "three"]
    with pytest.raises(ValueError, match="splitter: matches the empty text"):
        ProcessRewardModelParams(splitter="x*")


def test_monte_carlo_labels_soft_and_hard(tiny_model):
    # one solution of two steps; from the first step's prefix 1 of 2 continuations reaches 4, from the second none
    rows = sums(3, lambda i: 2)[2:]  # 2 + 2 = 4
    tok = models.load_tokenizer(tiny_model)
    # keys are tried in order: a continuation's prompt holds its prefix, the solution's holds the problem only
    texts = {"so five": ["\nAnswer: 5"], "two and": ["Answer: 4", "Answer: 9"], "2 + 2": ["two and\nso five"]}
    soft = steps.labelled(
        scripted(tok, texts), rows, FMT, ProcessRewardModelParams(solutions_per_prompt=1, rollouts=2), 0
    )
    assert soft == [
        {
            "id": "2",
            "prompt": "Calculate 2 + 2.",
            "bucket": "all",
            "steps": ["two and\n", "so five"],
            "labels": [0.5, 0.0],
        }
    ]
    hard = steps.labelled(
        scripted(tok, texts), rows, FMT, ProcessRewardModelParams(solutions_per_prompt=1, rollouts=2, labels="hard"), 0
    )
    assert hard[0]["labels"] == [1.0, 0.0]


def _labelled(count: int) -> list[dict]:
    """Solutions whose steps say 'fine' (label 1) or 'oops' (label 0), mixed at random."""
    rng = random.Random(0)
    out = []
    for i in range(count):
        marks = [rng.random() < 0.5 for _ in range(3)]
        out.append(
            {
                "id": str(i),
                "prompt": f"Calculate {i} + 2.",
                "steps": [f"{'fine' if m else 'oops'}\n" for m in marks],
                "labels": [float(m) for m in marks],
            }
        )
    return out


def _prm_job(tiny_model: Path, work: Path, data: Path, max_steps: int, **kw) -> ProcessRewardModelJob:
    params = ProcessRewardModelParams(
        max_steps=max_steps,
        save_steps=min(2, max_steps) if max_steps <= 4 else max_steps,
        learning_rate=3e-3,
        per_device_train_batch_size=8,
    )
    return job(
        ProcessRewardModelJob, tiny_model, data, work, key="process_reward_models.prm", params=params, seed=2, **kw
    )


def test_a_process_reward_model_learns_step_labels_and_resumes(tiny_model, tmp_path):
    from transformers import AutoModelForTokenClassification

    rows = _labelled(48)
    data_dir = tmp_path / "data"
    heldout.write(data_dir, rows[:36], rows[36:])
    result = launch.train(
        _prm_job(tiny_model, tmp_path / "w", data_dir / heldout.TRAIN, 20), launch.LaunchParams(), tmp_path / "prm"
    )
    assert result["weights_relative_change"] > 0
    found = heldout.process_reward_model(tmp_path / "prm", data_dir)
    assert found["steps"] == 36 and found["step_accuracy"] >= found["majority_accuracy"] + 0.2, found
    prm = ProcessRewardModel(tmp_path / "prm")
    good, bad = prm.step_scores("Calculate 1 + 2.", "fine\noops\n")
    assert good > bad
    # resume: a run killed after checkpoint-2 of 4 and rerun trains what an unkilled one does
    short = data_dir / heldout.TRAIN
    launch.train(_prm_job(tiny_model, tmp_path / "whole", short, 4), launch.LaunchParams(), tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        cut = _prm_job(tiny_model, tmp_path / "cut", short, 4, callbacks=["tests.test_reward_models:CrashAt2"])
        launch.train(cut, launch.LaunchParams(), tmp_path / "b")
    launch.train(_prm_job(tiny_model, tmp_path / "cut", short, 4), launch.LaunchParams(), tmp_path / "b")
    _assert_same_weights(tmp_path / "a", tmp_path / "b", AutoModelForTokenClassification)


def _workspace(tmp_path: Path, tiny_model: Path, default_params: dict, **sections) -> Path:
    ws = tmp_path / "ws"
    shutil.copytree(tiny_model, ws / paths.SFT)
    files.write_jsonl(ws / paths.FILTERED, sums(20, lambda i: 2, graded=True))
    (ws / "params.yaml").write_text(yaml.safe_dump({**default_params, **sections}))
    return ws


def test_validate_refuses_in_one_line_before_any_compute(default_params, tmp_path, monkeypatch):
    from rung import preflight

    def refused(sections: dict) -> str:
        with pytest.raises((ConfigError, InputError)) as e:
            preflight.check(config.parse({**default_params, **sections}))
        assert "\n" not in str(e.value)
        return str(e.value)

    assert refused({"reward_models": {"rm": {"ensemble": 0}}}).endswith(
        "reward_models.rm.ensemble: Input should be greater than or equal to 1"
    )
    assert "reward_models.rm.pairs.pairs_per_prompt: 5 pairs cannot come from 4 samples (at most 4)" in refused(
        {"reward_models": {"rm": {"pairs": {"samples_per_prompt": 4, "pairs_per_prompt": 5}}}}
    )
    monkeypatch.chdir(tmp_path)
    assert refused({"reward_models": {"rm": {"pairs": {"type": "file", "path": "no.jsonl"}}}}) == (
        "reward_models.rm.pairs.path: no.jsonl not found"
    )
    episodes = {"environment": {"name": "retry"}}
    assert refused({**episodes, "reward_models": {"rm": {}}}).startswith(
        "reward_models.rm.pairs: samples are graded single-turn"
    )
    assert refused({**episodes, "process_reward_models": {"prm": {}}}).startswith("process_reward_models.prm: samples")
    assert refused({"process_reward_models": {"p m": {}}}).endswith(
        "process_reward_models.p m: names may use letters, digits, '_' and '-' only"
    )


@pytest.fixture(scope="module")
def prefect():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):  # a loaded 2-core CI runner starts it slowly
        yield


def test_the_stages_flows_write_models_metrics_and_mlflow_runs(
    prefect, tiny_model, tmp_path, default_params, monkeypatch
):
    """reward_models@rm: a file's separable pairs, an ensemble of 2 that learns them; reward_models@mine: the
    tiny model's own samples, all wrong, give no pair (refused in one line); process_reward_models@prm: labels,
    training and held-out step accuracy, end to end."""
    import mlflow

    import flows.process_reward_models
    import flows.reward_models

    rm = {"pairs": {"type": "file", "path": "prefs.jsonl"}, "ensemble": 2, "max_steps": 12, "learning_rate": 1e-3}
    mine = {
        "pairs": {"samples_per_prompt": 2, "pairs_per_prompt": 1, "max_prompts": 3, "sampling": {"max_new_tokens": 4}}
    }
    prm = {
        "solutions_per_prompt": 1,
        "rollouts": 2,
        "max_prompts": 4,
        "max_steps": 2,
        "sampling": {"max_new_tokens": 6},
    }
    ws = _workspace(
        tmp_path, tiny_model, default_params, reward_models={"rm": rm, "mine": mine}, process_reward_models={"prm": prm}
    )
    monkeypatch.chdir(ws)
    files.write_jsonl("prefs.jsonl", separable(40))
    flows.reward_models.reward_models("rm")
    out = files.read_json(paths.metrics("reward_models-rm"))
    assert out["heldout"]["pairwise_accuracy"] >= 0.85 and out["heldout"]["heldout_pairs"] == 8
    assert set(out["heldout"]["members"]) == {"0", "1"} and all(
        m["weights_relative_change"] > 0 for m in out["train"].values()
    )
    member = [paths.learned_reward("reward_models", "rm") / f"member-{i}" for i in (0, 1)]
    assert scoring.members(member[0].parent, "k") == member
    a, b = (scoring.load(m)[0].score.weight for m in member)
    assert not torch.equal(a, b)  # two seeds
    assert len(files.read_jsonl(paths.learned_reward_data("reward_models", "rm") / heldout.TRAIN)) == 32
    with pytest.raises(
        InputError, match=r"^reward_models.mine.pairs: no pair to train on \(\{'prompts': 2, 'prompts_no_right': 2"
    ):
        flows.reward_models.reward_models("mine")
    flows.process_reward_models.process_reward_models("prm")
    found = files.read_json(paths.metrics("process_reward_models-prm"))
    assert found["train"]["steps"] == 2 and found["labels"]["solutions"] == 4 and "step_accuracy" in found["heldout"]
    ProcessRewardModel(paths.learned_reward("process_reward_models", "prm"))
    runs = mlflow.search_runs(search_all_experiments=True, output_format="list")
    logged = {r.info.run_name: r.data.metrics for r in runs}
    assert (
        logged["reward_models@rm"]["reward_models-rm/heldout/pairwise_accuracy"] == out["heldout"]["pairwise_accuracy"]
    )
    assert "process_reward_models-prm/heldout/step_accuracy" in logged["process_reward_models@prm"]
    tags = {r.info.run_name: r.data.tags for r in runs}
    assert tags["reward_models@rm"]["rung.model_dir"] == "data/models/reward_models/rm"


def test_the_report_shows_each_learned_reward_on_what_it_held_out():
    from rung.report import pipeline as rep

    rm = {
        "heldout": {"heldout_pairs": 8, "pairwise_accuracy": 0.875, "auroc": 0.8125, "auroc_by_bucket": {"hard": 0.75}}
    }
    prm = {"heldout": {"steps": 36.0, "step_accuracy": 0.8, "majority_accuracy": 0.6, "step_mae": 0.3}}
    file_rm = {"heldout": {"heldout_pairs": 4, "pairwise_accuracy": 1.0}}
    assert rep.learned_summary(rm) == {
        "held out": "8 pairs",
        "accuracy": "pairwise 87.5%",
        "chance": "50%",
        "AUROC": "0.81 (hard 0.75)",
    }
    assert rep.learned_summary(prm)["accuracy"] == "step 80.0%" and rep.learned_summary(prm)["AUROC"] == "—"
    assert rep.learned_summary(file_rm)["AUROC"] == "—"
