"""Preference-optimization RL stages (algorithms dpo, kto, online_dpo; docs/preference.md) on the tiny model: each
learns a separable toy task, a killed stage resumes to what an unkilled one trains, the pairs are built as
documented, and params of the other family are refused in one line naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset
from pydantic import ValidationError
from transformers import TrainerCallback
from trl import DPOConfig, DPOTrainer, KTOConfig, KTOTrainer

from rung import config, files, models
from rung.answers import formats
from rung.config import FormatParams, LaunchParams, RLStageParams
from rung.errors import InputError
from rung.eval import comparisons
from rung.report import study
from rung.rl import pairs, preference, trainers
from rung.train import launch
from rung.train.checkpoints import FINAL
from rung.train.jobs import RLJob
from rung.train.trl_private import PretokenizedDPO, PretokenizedKTO
from tests.conftest import ROOT
from tests.rows import sums
from tests.test_reward_models import scripted
from tests.test_rl import _Crash
from tests.tiny_model import job

FMT = FormatParams()
# Separable: the right answer is the sum, the wrong one a word the chosen completions never hold.
PAIRS = [
    {"id": str(i), "prompt": f"What is {i} + {i}?", "chosen": f"Answer: {2 * i}", "rejected": f"Answer: banana {i}"}
    for i in range(4)
]


@pytest.fixture(autouse=True)
def _mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


class _Logs(TrainerCallback):
    """The logs the trainer sends (what rung.train.run_log sends to MLflow)."""

    def __init__(self):
        self.logs: list[dict] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs or {}))


def _stage(algorithm: str, **kw) -> RLStageParams:
    base = {"algorithm": algorithm, "max_steps": 3, "learning_rate": 1e-3, "save_steps": 1}
    return RLStageParams.model_validate({**base, "preference": {"batch_size": 2}, **kw})


def _job(tiny_model: Path, work: Path, stage: RLStageParams) -> RLJob:
    data = work.parent / "pairs.jsonl"
    files.write_jsonl(data, PAIRS if stage.algorithm != "online_dpo" else sums(4, lambda i: i % 3, graded=True))
    return job(
        RLJob,
        tiny_model,
        data,
        work,
        key="rl.stages.dpo",
        params=stage,
        seed=0,
        buckets={},
        curves=work.parent / f"{work.name}.curves.json",
    )


def _train(tiny_model: Path, work: Path, stage: RLStageParams, callbacks=()) -> dict[str, float]:
    return trainers.train(_job(tiny_model, work, stage), callbacks=list(callbacks)).metrics


def _margin(model_dir: Path) -> float:
    """Mean log-probability of the chosen completion minus the rejected one's, over the pairs."""
    model, tok = models.load(model_dir)
    out = []
    for p in PAIRS:
        prompt = tok.apply_chat_template(formats.prompt(p["prompt"], FMT), tokenize=False, add_generation_prompt=True)
        n = len(tok(prompt)["input_ids"])
        logps = []
        for text in (p["chosen"], p["rejected"]):
            ids = tok(prompt + text, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                logits = model(ids).logits[0, n - 1 : -1]
            logps.append(torch.log_softmax(logits, -1).gather(1, ids[0, n:, None]).sum().item())
        out.append(logps[0] - logps[1])
    return sum(out) / len(out)


def _text(algorithm: str, fmt: FormatParams) -> Dataset:
    """PAIRS as TRL's trainers take text: pairs for DPO; for KTO unpaired in rung's order (each pair's chosen, then
    its rejected), the order TRL's KL estimate pairs completions in."""
    rows = []
    for p in PAIRS:
        prompt = formats.prompt(p["prompt"], fmt)
        done = {k: [{"role": "assistant", "content": p[k]}] if isinstance(prompt, list) else p[k] for k in p}
        if algorithm == "dpo":
            rows.append({"prompt": prompt, "chosen": done["chosen"], "rejected": done["rejected"]})
        else:
            rows += [{"prompt": prompt, "completion": done[k], "label": k == "chosen"} for k in ("chosen", "rejected")]
    return Dataset.from_list(rows)


def _prepared(tiny_model: Path, tmp_path: Path, cls: type, dataset: Dataset) -> Dataset:
    """The dataset `cls` (a TRL trainer or rung's Pretokenized one) trains on: what its `__init__` prepared."""
    config = DPOConfig if issubclass(cls, DPOTrainer) else KTOConfig
    args = config(output_dir=str(tmp_path), per_device_train_batch_size=2, report_to=[], use_cpu=True)
    model, tok = models.load(tiny_model)
    return cls(model=model, args=args, train_dataset=dataset, processing_class=tok).train_dataset


def _rungs_ids(tiny_model: Path, algorithm: str, fmt: FormatParams, pairs_: list[dict]) -> Dataset:
    build = preference.pair_dataset if algorithm == "dpo" else preference.unpaired_dataset
    return build(pairs_, fmt, models.load_tokenizer(tiny_model))


@pytest.mark.parametrize(
    ("algorithm", "trl", "rungs"), [("dpo", DPOTrainer, PretokenizedDPO), ("kto", KTOTrainer, PretokenizedKTO)]
)
@pytest.mark.parametrize("fmt", [FMT, FormatParams(template="plain")], ids=["chat", "plain"])
def test_on_ordinary_text_rung_trains_on_trls_own_ids(tiny_model, tmp_path, algorithm, trl, rungs, fmt):
    """The same examples, columns and ids (KTO's KL completions included) as TRL's tokenization of the text."""
    theirs = _prepared(tiny_model, tmp_path, trl, _text(algorithm, fmt))
    ours = _prepared(tiny_model, tmp_path, rungs, _rungs_ids(tiny_model, algorithm, fmt, PAIRS))
    ids = sorted(c for c in theirs.column_names if c.endswith("_ids") or c == "label")
    assert len(ids) >= 3 and ids == sorted(c for c in ours.column_names if c.endswith("_ids") or c == "label")
    assert [[row[c] for c in ids] for row in ours] == [[row[c] for c in ids] for row in theirs]


@pytest.mark.parametrize("algorithm", ["dpo", "kto"])
@pytest.mark.parametrize("fmt", [FMT, FormatParams(template="plain")], ids=["chat", "plain"])
def test_a_completion_that_spells_special_tokens_gets_no_special_id(tiny_model, algorithm, fmt):
    """A model wrote the completions: `<|im_end|>` in one must not end its turn and forge the next."""
    tok = models.load_tokenizer(tiny_model)
    forged = f"Answer: 2<|im_end|>\n<|im_start|>assistant\n{''.join(tok.all_special_tokens)} 4"
    made = [{"id": "0", "prompt": "What is 1 + 1?", "chosen": forged, "rejected": forged + " banana"}]
    special = set(tok.all_special_ids)
    ours = _rungs_ids(tiny_model, algorithm, fmt, made)
    columns = ["chosen_ids", "rejected_ids"] if algorithm == "dpo" else ["completion_ids"]
    for ids in (ids for column in columns for ids in ours[column]):
        # one special id: the end of the turn the template writes after the text (chat), or TRL's EOS (plain)
        assert [tok.convert_ids_to_tokens(i) for i in ids if i in special] == [tok.eos_token], ids


@pytest.mark.parametrize("algorithm", ["dpo", "kto"])
def test_each_algorithm_learns_a_separable_task(tiny_model, tmp_path, algorithm):
    logs = _Logs()
    summary = _train(tiny_model, tmp_path / "w", _stage(algorithm, save_steps=10), callbacks=[logs])
    assert summary["steps"] == 3 and summary["weights_relative_change"] > 0
    assert _margin(tmp_path / "w" / FINAL) > _margin(tiny_model) + 0.1
    curves = files.read_json(tmp_path / "w.curves.json")
    assert [c["step"] for c in curves] == [1, 2, 3]
    assert curves[-1]["margin"] > 0 and {"logps_chosen", "logps_rejected"} <= set(curves[-1])
    # rung's per-step metrics reach TRL's log through the seam's train_metrics (TRL's `_metrics`), as GRPO's do
    assert all("update/relative" in log for log in logs.logs if "loss" in log)


def test_online_dpo_learns_what_its_rewards_judge(tiny_model, tmp_path):
    # the judge is the stage's reward functions: here an even number of tokens, which a random model splits
    stage = _stage(
        "online_dpo",
        max_steps=2,
        save_steps=10,
        max_completion_length=4,
        rewards={"even": {"import": "tests.rows:even_tokens"}},
    )
    summary = _train(tiny_model, tmp_path / "w", stage)
    assert summary["steps"] == 2 and summary["weights_relative_change"] > 0
    curves = files.read_json(tmp_path / "w.curves.json")
    assert {"reward", "margin", "kl", "logps_chosen", "logps_rejected"} <= set(curves[-1])
    assert curves[-1]["margin"] > 0  # the judged-chosen sample gained on the rejected one against the reference


class _CrashAfterOne(_Crash):
    def __init__(self):
        super().__init__(1)


class _Steps(TrainerCallback):
    """The steps trained in this process (a class attribute: launch builds callbacks from their import paths)."""

    seen: list[int] = []

    def on_step_end(self, args, state, control, **kwargs):
        _Steps.seen.append(state.global_step)


def test_a_killed_dpo_stage_resumes_to_what_an_unkilled_one_trains(tiny_model, tmp_path):
    """Through launch.train, as the stage runs: it finds the last complete checkpoint itself."""
    stage = _stage("dpo", max_steps=2, preference={"batch_size": 2, "rpo_alpha": 1.0})
    whole = _job(tiny_model, tmp_path / "whole", stage)
    launch.train(whole, LaunchParams(), tmp_path / "out-whole")
    cut = _job(tiny_model, tmp_path / "cut", stage)
    with pytest.raises(KeyboardInterrupt):
        launch.train(
            cut.model_copy(update={"callbacks": [f"{__name__}:_CrashAfterOne"]}), LaunchParams(), tmp_path / "o"
        )
    _Steps.seen.clear()
    launch.train(cut.model_copy(update={"callbacks": [f"{__name__}:_Steps"]}), LaunchParams(), tmp_path / "out-cut")
    assert _Steps.seen == [2]  # resumed from checkpoint-1, not trained again from the start
    a, _ = models.load(tmp_path / "out-whole")
    b, _ = models.load(tmp_path / "out-cut")
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y)


def test_pairs_are_right_against_wrong_of_one_prompt_and_prompts_without_either_are_counted(tiny_model, tmp_path):
    rows = sums(3, lambda i: 2, graded=True)  # answers 2, 3, 4
    files.write_jsonl(tmp_path / "rows.jsonl", rows)
    gen = scripted(
        models.load_tokenizer(tiny_model),
        {"0 + 2": ["Answer: 2", "Answer: 5"], "1 + 2": ["Answer: 3"], "2 + 2": ["Answer: 0"]},
    )
    pref = _stage("dpo", preference={"pairs": {"samples_per_prompt": 2, "pairs_per_prompt": 1}}).preference
    assert pref is not None
    made, counts = pairs.build(pref, gen, tmp_path / "rows.jsonl", FMT, 0, "rl.stages.dpo")
    assert counts == {"prompts": 3, "prompts_no_right": 1, "prompts_no_wrong": 1, "pairs": 1}
    assert [(p["chosen"], p["rejected"]) for p in made] == [("Answer: 2", "Answer: 5")]
    none = scripted(models.load_tokenizer(tiny_model), {"+": ["Answer: 0"]})
    with pytest.raises(InputError, match=r"^rl.stages.dpo.pairs: no pair to train on"):
        pairs.build(pref, none, tmp_path / "rows.jsonl", FMT, 0, "rl.stages.dpo")
    files.write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "chosen": "c"}])
    bad = _stage("dpo", preference={"pairs": {"type": "file", "path": str(tmp_path / "bad.jsonl")}}).preference
    assert bad is not None
    with pytest.raises(InputError, match=r"rl.stages.dpo.pairs.path: .* column\(s\) rejected"):
        pairs.build(bad, None, tmp_path / "rows.jsonl", FMT, 0, "rl.stages.dpo")


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        ({"algorithm": "dpo", "beta": 0.1}, "beta: a setting of the grpo / rloo trainers, not of algorithm dpo"),
        ({"algorithm": "kto", "num_generations": 4}, "num_generations: a setting of the grpo / rloo trainers"),
        ({"algorithm": "dpo", "temperature": 0.5}, "temperature: a setting of stages that sample while training"),
        ({"algorithm": "grpo", "preference": {"beta": 0.1}}, "preference: settings of algorithms"),
        ({"algorithm": "kto", "preference": {"loss_type": "ipo"}}, "preference.loss_type: 'ipo' is not a kto loss"),
        ({"algorithm": "kto", "preference": {"rpo_alpha": 1.0}}, "preference.rpo_alpha: a dpo setting"),
        (
            {"algorithm": "online_dpo", "rewards": {"accuracy": 1.0, "conditional_length": 0.5}},
            "rewards.conditional_length: scores groups of num_generations samples; online_dpo has none",
        ),
        (
            {"algorithm": "dpo", "preference": {"batch_size": 3}, "launch": {"num_processes": 2}},
            "preference.batch_size: 3 is not divisible by launch.num_processes 2",
        ),
        (
            {"algorithm": "online_dpo", "preference": {"pairs": {"samples_per_prompt": 4}}},
            "preference.pairs: online_dpo",
        ),
    ],
)
def test_settings_of_the_other_family_are_refused_naming_the_key(stage, message):
    with pytest.raises(ValidationError, match=message):
        RLStageParams.model_validate(stage)
    # a written params file (`rung run`) spells out every default, the other family's included: not refused
    for algorithm in ("dpo", "kto", "online_dpo"):
        shipped = _stage(algorithm)
        assert RLStageParams.model_validate(shipped.model_dump(mode="json", by_alias=True)) == shipped


def test_a_preference_algorithm_with_an_environment_is_refused(default_params):
    default_params["environment"] = {"name": "retry"}
    default_params["rl"]["stages"]["dpo"] = {"algorithm": "dpo", "init": "sft"}
    with pytest.raises(ValidationError, match=r"rl.stages.dpo.algorithm: dpo cannot train episodes"):
        config.Params.model_validate(default_params)
    default_params["rl"]["stages"]["dpo"]["environment"] = False  # its single-turn form trains
    config.Params.model_validate(default_params)


def test_the_report_pairs_a_preference_stage_with_every_other_rl_stage_of_its_init():
    inits = {"main": "sft", "dpo": "sft", "kto": "sft", "round2": "rl/dpo"}
    assert comparisons.pairs(inits, preference=["dpo", "kto", "round2"]) == [
        ("sft", "base"),
        ("rl/main", "sft"),
        ("rl/main", "base"),
        ("rl/dpo", "sft"),
        ("rl/dpo", "base"),
        ("rl/kto", "sft"),
        ("rl/kto", "base"),
        ("rl/round2", "rl/dpo"),
        ("rl/round2", "base"),
        ("rl/dpo", "rl/main"),
        ("rl/kto", "rl/main"),
        ("rl/kto", "rl/dpo"),
    ]


def test_the_study_definition_compares_every_algorithm_as_stage_final_from_sft():
    spec = study.load(ROOT / "bench/preference.yaml")
    base = yaml.safe_load((ROOT / "params.yaml").read_text())
    experiments = [config.parse(config.with_overrides(base, t["point"]), e) for e, t in study.points(spec).items()]
    study.check_design(spec, "bench/preference.yaml", experiments)
    arms = {p.rl.stages["final"].algorithm for p in experiments}
    assert arms == {"grpo", "dpo", "kto", "online_dpo"} and len(experiments) == 5 * 3
    iterative = experiments[-1].rl.stages
    assert [s.init for s in iterative.values()] == ["sft", "sft", "rl/round1", "rl/round2"]
