"""The PSR / NSR / W-REINFORCE objectives (Zhu et al. 2025) through TRL's GRPOTrainer: the gradient
of TRL's loss on one generated batch equals that of the objective's definition, written out here."""

from __future__ import annotations

import pytest
import torch

from rung.config import ConfigError, RLStageParams, parse, read_yaml
from rung.rl import objectives, trainers
from tests.conftest import ROOT
from tests.test_rl import _job


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
