"""The PSR / NSR / W-REINFORCE objectives (Zhu et al. 2025) through TRL's GRPOTrainer: the gradient
of TRL's loss on one generated batch equals that of the objective's definition, written out here."""

from __future__ import annotations

import pytest
import torch

from rung import objectives
from rung.config import ConfigError, RLStageParams, parse, read_yaml
from rung.errors import InputError
from rung.rl import advantages, trainers
from tests.conftest import ROOT
from tests.test_rl import ONE_STEP, _job, _stage


def accuracy_by_parity(completion_ids, **_):
    """Stands in for the accuracy reward (1 correct / 0 wrong) on a random model: both grades occur."""
    return [float(ids[0] % 2) for ids in completion_ids]


def _definition(logps: list[torch.Tensor], correct: list[bool], objective: str, lam: float) -> torch.Tensor:
    """The paper's losses on samples y of the policy, with the policy-gradient identity grad pi = pi grad
    log pi: L_PSR = -sum_{y correct} log pi(y), L_NSR = +sum_{y wrong} log pi(y), W = lam * L_PSR + L_NSR;
    each log pi(y) a sum over its tokens, divided by the batch's completion tokens (TRL's dapo loss)."""
    tokens = sum(len(lp) for lp in logps)
    psr = -sum(lp.sum() for lp, ok in zip(logps, correct, strict=True) if ok) / tokens
    nsr = sum(lp.sum() for lp, ok in zip(logps, correct, strict=True) if not ok) / tokens
    return {"psr": psr, "nsr": nsr, "w_reinforce": lam * psr + nsr}[objective]


@pytest.mark.parametrize("objective", ["psr", "nsr", "w_reinforce"])
def test_gradient_equals_the_objectives_definition(objective, tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    stage = RLStageParams.model_validate(
        {
            "preset": objective,
            "positive_weight": 0.3,  # not the default, so a lambda ignored somewhere shows
            "max_steps": 1,
            "num_generations": 4,
            "prompts_per_step": 2,
            "max_completion_length": 6,
            "rewards": {"accuracy": {"import": "tests.test_objectives:accuracy_by_parity"}},
        }
    )
    trainer = trainers.trainer_for(_job(tiny_model, tmp_path / "w", stage))
    model = trainer.model
    model.train()
    torch.manual_seed(0)
    batch = trainer._generate_and_score_completions([trainer.train_dataset[0]] * 8)  # the curriculum draws 2 prompts
    trainer.current_gradient_accumulation_steps = 1
    model.zero_grad()
    trainer.compute_loss(model, batch).backward()
    theirs = [p.grad.clone() for p in model.parameters()]

    # The same completions graded and scored by hand: each row without padding, alone.
    logps, correct = [], []
    for p_ids, p_mask, c_ids, c_mask in zip(
        batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], batch["completion_mask"], strict=True
    ):
        prompt, completion = p_ids[p_mask.bool()], c_ids[c_mask.bool()]
        logits = model(torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1]
        logps.append(torch.log_softmax(logits.float(), -1).gather(1, completion[:, None])[:, 0])
        correct.append(int(completion[0]) % 2 == 1)
    assert 0 < sum(correct) < len(correct), "the batch needs correct and wrong completions"
    model.zero_grad()
    _definition(logps, correct, objective, 0.3).backward()
    for a, b in zip(theirs, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


def test_signed_advantages():
    acc = torch.tensor([1.0, 0.0, float("nan"), 1.0])
    assert objectives.signed_advantages(acc, "psr").tolist() == [1.0, 0.0, 0.0, 1.0]
    assert objectives.signed_advantages(acc, "nsr").tolist() == [0.0, -1.0, 0.0, 0.0]
    assert objectives.signed_advantages(acc, "w_reinforce", 0.25).tolist() == [0.25, -1.0, 0.0, 0.25]
    with pytest.raises(ValueError, match="objective must be one of"):
        objectives.signed_advantages(acc, "group_relative")


ACCURACY = {"rewards": {"accuracy": 1.0}}


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (
            {"preset": "nsr", "rewards": {"accuracy": 1.0, "format": 0.1}},
            "rl.stages.main.rewards.format: objective nsr",
        ),
        ({"objective": "psr", "dynamic_sampling": {"max_rounds": 2}}, "rl.stages.main.dynamic_sampling: objective psr"),
        ({"objective": "psr", "algorithm": "rloo"}, "rl.stages.main.algorithm: objective psr"),
        ({"preset": "w_reinforce", "rewards": {"format": 1.0}}, "rl.stages.main.rewards: objective w_reinforce"),
        ({"preset": "w_reinforce", "positive_weight": 2}, "rl.stages.main.positive_weight: Input should be less"),
        # the paper's gradient is a token mean over the batch (loss_type dapo) without a KL term
        ({**ACCURACY, "preset": "nsr", "loss_type": "grpo"}, "rl.stages.main.loss_type: objective nsr .* token mean"),
        ({**ACCURACY, "preset": "psr", "loss_type": "dr_grpo"}, "rl.stages.main.loss_type: objective psr"),
        ({**ACCURACY, "preset": "w_reinforce", "beta": 0.04}, "rl.stages.main.beta: objective w_reinforce .* KL"),
        ({**ACCURACY, "preset": "grpo", "objective": "nsr"}, "rl.stages.main.loss_type: objective"),
    ],
)
def test_signed_objectives_refuse_settings_that_break_them(stage, message):
    data = {**read_yaml(ROOT / "params.yaml"), "rl": {"stages": {"main": stage}}}
    with pytest.raises(ConfigError, match=message):
        parse(data)


def test_presets_select_the_objectives():
    for name in ("psr", "nsr", "w_reinforce"):
        stage = RLStageParams.model_validate({"preset": name, "rewards": {"accuracy": 1.0}})
        assert (stage.objective, stage.beta, stage.loss_type, stage.dynamic_sampling) == (name, 0.0, "dapo", None)
    assert RLStageParams().objective == "group_relative"


def test_logs_and_curricula_see_the_same_under_every_objective(tiny_model, tmp_path, monkeypatch):
    """The completions table logs the advantages trained on, and a bandit's learnability signal (|A|
    of the group-relative advantage) is the same whichever objective trains: not the accuracy under
    PSR and 1 - accuracy under NSR."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    values = {}
    for objective in ("group_relative", "psr", "nsr"):
        stage = _stage(
            objective=objective,
            **ONE_STEP,
            curriculum={"type": "bandit", "step_size": 1.0},
            rewards={"accuracy": {"import": "tests.test_objectives:accuracy_by_parity"}},
        )
        trainer = trainers.trainer_for(_job(tiny_model, tmp_path / objective, stage))
        trainer.model.train()
        batch = trainer._generate_and_score_completions([trainer.train_dataset[0]] * 16)
        assert list(trainer._logs["advantages"]) == batch["advantages"].tolist()
        values[objective] = dict(trainer.batch_source.curriculum.value)
    assert any(values["psr"].values())  # some arm had a group with both grades
    assert values["psr"] == values["nsr"] == values["group_relative"]


def test_passk_study_says_what_each_arm_optimises():
    """bench/passk.yaml's comment on each arm names every reward that arm trains on (the dapo arm, the
    stage as it ships, adds the overlong punishment), and a KL penalty where the arm has one."""
    import re

    from flows import study as flow

    path = ROOT / "bench/passk.yaml"
    _, _, todo, checked = flow.plan(str(path), str(ROOT / "params.yaml"))
    stages = {t["arm"]: checked[exp].rl.stages["main"] for exp, t in todo.items()}
    comments = dict(re.findall(r"^  (\w+):[^#\n]*#(.*)$", path.read_text(), flags=re.M))
    for arm, stage in stages.items():
        optimised = [name for name, r in stage.rewards.items() if r.weight != 0] + (["KL"] if stage.beta else [])
        assert all(word in comments[arm] for word in optimised), (arm, optimised, comments[arm])
    assert "optimise the same reward" not in path.read_text()


def halved(rewards, reward_names, trl_advantages, group_size, settings):
    """An objective given by its import path: TRL's advantages halved."""
    return trl_advantages / 2


def not_an_objective(completions):
    return completions


def test_an_objective_is_a_registered_name_or_an_import_path_checked_in_one_line(tmp_path):
    assert list(objectives.OBJECTIVES)[:4] == ["group_relative", "psr", "nsr", "w_reinforce"]
    with pytest.raises(ConfigError, match=r"^params.yaml: rl.stages.main.objective: 'reinforce' is neither"):
        parse({**read_yaml(ROOT / "params.yaml"), "rl": {"stages": {"main": {"objective": "reinforce"}}}})
    stage = RLStageParams.model_validate({"objective": "tests.test_objectives:halved"})
    adv = advantages.Advantages.of(stage, "rl.stages.main")
    assert adv(torch.zeros(4, 1), ["accuracy"], torch.tensor([2.0, -2.0, 0.0, 4.0]), 2).tolist() == [1, -1, 0, 2]
    for path, message in [
        ("tests.test_objectives:missing", "rl.stages.main.objective: cannot load 'tests.test_objectives:missing'"),
        ("tests.test_objectives:not_an_objective", "rl.stages.main.objective: .* must be a function \\(rewards,"),
    ]:
        with pytest.raises(InputError, match=f"^{message}"):
            advantages.resolve(RLStageParams.model_validate({"objective": path}), "rl.stages.main")


def test_an_imported_objective_registered_where_it_is_defined_keeps_its_constraints():
    """A function registered with constraints refuses, given by its import path, what its name refuses."""
    stage = RLStageParams.model_validate({"objective": "rung.objectives.signed:nsr", "rewards": {"accuracy": 1.0}})
    assert advantages.resolve(stage, "rl.stages.main") is objectives.OBJECTIVES["nsr"]
    with pytest.raises(InputError, match=r"^rl.stages.main.loss_type: objective nsr .* token mean"):
        advantages.resolve(stage.model_copy(update={"loss_type": "grpo"}), "rl.stages.main")
