"""Reward functions on literal completions: built-ins, custom imports, and failure isolation."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rung.answers import verify
from rung.config import FormatParams, RLStageParams
from rung.errors import InputError
from rung.rl.rewards import Accuracy, ConditionalLength, Format, Guarded, Overlong, build, error_counts

FMT = FormatParams()
STAGE = RLStageParams(num_generations=2, max_completion_length=10)


def _conv(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _cols(n: int) -> dict:
    return dict(
        answer=["2"] * n,
        task=["basic_arithmetic"] * n,
        prompt_text=["Calculate 5 - 3."] * n,
        meta=['{"expression": "5 - 3"}'] * n,
    )


def test_accuracy_and_format_on_conversational_completions():
    completions = [_conv("5 - 3 = 2\nAnswer: 2"), _conv("Answer: 3"), _conv("it is 2")]
    assert Accuracy(FMT, STAGE)(completions, **_cols(3)) == [1.0, 0.0, 0.0]
    assert Format(FMT, STAGE)(completions, **_cols(3)) == [1.0, 1.0, 0.0]


def test_overlong_soft_punishment_is_zero_then_linear_then_capped():
    reward = Overlong(FMT, STAGE, buffer=4, penalty=1.0)  # free up to 6 tokens, -1 at 10
    ids = [[0] * n for n in (3, 6, 8, 10, 12)]
    assert reward([""] * 5, completion_ids=ids) == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert Overlong(FMT, STAGE).buffer == 2  # a fifth of max_completion_length, as DAPO (4096 / 20480)
    with pytest.raises(InputError, match="overlong.args.buffer"):
        Overlong(FMT, STAGE, buffer=11)


def test_conditional_length_only_when_the_whole_group_is_correct():
    completions = [_conv("Answer: 2"), _conv("so\nAnswer: 2"), _conv("Answer: 2"), _conv("Answer: 9")]
    ids = [[0] * 2, [0] * 5, [0] * 2, [0] * 2]
    out = ConditionalLength(FMT, STAGE)(completions, completion_ids=ids, **_cols(4))
    assert out == [0.8, 0.5, 0.0, 0.0]  # group 1 all correct: 1 - len/10; group 2 has a wrong answer


TOWER = "9^{9^{9^{9}}}"
"""An answer math-verify cannot compare with 3 in any time: its comparison times out."""


def _math(golds: list[str]) -> dict:
    n = len(golds)
    return dict(answer=golds, task=["math"] * n, prompt_text=["?"] * n, meta=["{}"] * n)


def test_a_math_grader_crash_is_unscored_not_wrong(monkeypatch):
    """math-verify swallows its errors and time-outs (False / []): they surface as GraderFailed, so the
    accuracy reward leaves the completion unscored (None) where it used to score it 0.0, a wrong answer."""
    monkeypatch.setattr(verify, "MATH_TIMEOUT", 1)
    with pytest.raises(verify.GraderFailed, match="math-verify failed"):
        verify.is_correct(TOWER, {"task": "math", "answer": "3", "meta": {}})  # a time-out
    with pytest.raises(verify.GraderFailed, match="math-verify failed"):
        verify.is_correct("5", {"task": "math", "answer": "\\frac{1}{0}", "meta": {}})  # an error (zoo)
    accuracy = Guarded(Accuracy(FMT, STAGE), "accuracy", group=2)
    cols = _math(["3", "3", "\\frac{1}{0}"])
    assert accuracy([_conv("Answer: 3"), _conv(f"Answer: {TOWER}"), _conv("Answer: 5")], **cols) == [1.0, None, None]
    assert accuracy.crashed == [1, 2] and accuracy.errors == 2


def test_a_math_gold_the_grader_fails_on_is_unverifiable_not_a_failed_stage():
    from rung.data.curate import verifiable

    assert not verifiable({"task": "math", "answer": "\\frac{1}{0}", "meta": {}})
    assert verifiable({"task": "math", "answer": "\\frac{1}{2}", "meta": {}})


def test_group_rewards_see_their_group_minus_the_crashed_completions(monkeypatch):
    """A crash in one group used to rescore every completion alone: in the other group, one right and one
    wrong, the right one got the length bonus (0.6) as a group of one. Each group is scored whole, a
    crashed completion left out of its group only; and a group missing a completion pays no length bonus:
    the unscored one is not known to be right (it once paid 0.8 to the crashed one's only group-mate)."""
    monkeypatch.setattr(verify, "MATH_TIMEOUT", 1)
    reward = Guarded(ConditionalLength(FMT, STAGE), "conditional_length", group=2)
    completions = [_conv("Answer: 2"), _conv("Answer: 3"), _conv("Answer: 3"), _conv(f"Answer: {TOWER}")]
    ids = [[0] * 4, [0] * 4, [0] * 2, [0] * 2]
    cols = {k: _cols(2)[k] + _math(["3", "3"])[k] for k in _cols(2)}  # 5 - 3 twice, then a math problem twice
    assert ConditionalLength(FMT, STAGE)(completions[:2], completion_ids=ids[:2], **_cols(2)) == [0.0, 0.0]
    assert reward(completions, completion_ids=ids, **cols) == [0.0, 0.0, 0.0, None]
    assert reward.crashed == [3]
    right = [_conv("Answer: 3")] * 2
    assert ConditionalLength(FMT, STAGE)(right, completion_ids=ids[2:], **_math(["3", "3"])) == [0.8, 0.8]


def flaky(completions, **_):
    """A custom reward that fails on one completion."""
    return [1 / (len(c[-1]["content"]) - 1) for c in completions]


def test_build_custom_reward_and_isolate_failures():
    stage = RLStageParams.model_validate(
        {"rewards": {"accuracy": 1.0, "flaky": {"weight": 0.5, "import": "tests.test_rewards:flaky"}}}
    )
    funcs, weights = build(stage, FMT, key="rl.stages.main.rewards")
    assert [f.__name__ for f in funcs] == ["accuracy", "flaky"] and weights == [1.0, 0.5]
    logged = []
    scores = funcs[1](
        [_conv("ab"), _conv("a"), _conv("abc")], log_metric=lambda k, v: logged.append((k, v)), **_cols(3)
    )
    assert scores == [1.0, None, 0.5]  # the completion that raised is unscored (TRL: NaN), not wrong ...
    assert funcs[1].errors == 1 and logged == [("rewards/flaky/errors", 1.0)]  # ... and is counted


def test_custom_reward_import_errors_name_the_key():
    stage = RLStageParams.model_validate({"rewards": {"mine": {"import": "tests.test_rewards:missing"}}})
    with pytest.raises(InputError, match=r"rewards.mine.import: cannot load"):
        build(stage, FMT, key="rewards")


def test_dapo_preset_adds_overlong_and_dynamic_sampling():
    stage = RLStageParams.model_validate({"preset": "dapo", "epsilon_high": 0.3})
    assert (stage.loss_type, stage.epsilon, stage.epsilon_high) == ("dapo", 0.2, 0.3)  # own keys win
    assert stage.dynamic_sampling is not None and "overlong" in stage.rewards
    gspo = RLStageParams.model_validate({"preset": "gspo"})
    assert gspo.importance_sampling_level == "sequence" and gspo.epsilon == 3e-4


def test_the_registry_has_exactly_the_names_params_validate_against():
    """rung.config lists the built-in names so that params validate without importing the rewards."""
    from rung.config import BUILTIN_REWARDS
    from rung.rl.rewards import REGISTRY

    assert tuple(REGISTRY) == BUILTIN_REWARDS


def test_vllm_settings_reach_trl(tmp_path):
    """RL's vLLM keys (server address, memory share, context, importance-sampling correction) become
    GRPOConfig's fields of the same names."""
    from rung.rl import trainers

    vllm = dict(
        vllm_mode="server",
        vllm_server_base_url="http://node1:8000",
        vllm_gpu_memory_utilization=0.5,
        vllm_max_model_length=1024,
        vllm_importance_sampling_correction=False,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=2.0,
    )
    config = trainers.trl_config(RLStageParams(use_vllm=True, **vllm), [1.0, 0.1], seed=0, work_dir=tmp_path)
    assert config.use_vllm and {k: getattr(config, k) for k in vllm} == vllm
    with pytest.raises(ValidationError, match="vllm_gpu_memory_utilization"):
        RLStageParams(vllm_gpu_memory_utilization=1.5)


def fragile_accuracy(completion_ids, **_):
    """An accuracy reward whose grader raises on a third of a random model's completions."""
    if any(ids[0] % 3 == 0 for ids in completion_ids):
        raise ValueError("grader crashed")
    return [float(ids[0] % 2) for ids in completion_ids]


@pytest.mark.parametrize("objective", ["nsr", "group_relative"])
def test_a_grader_crash_is_unscored_not_wrong(objective, tiny_model, tmp_path, monkeypatch):
    """Under NSR a wrong completion is pushed down (advantage -1): a crash scored 0 would train the model
    away from whatever made the grader crash. A crashed completion gets advantage 0 under every
    objective (with another reward beside it too), and the crashes are counted per reward."""
    import torch

    from rung.rl import trainers
    from tests.test_rl import ONE_STEP, _job, _stage

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    rewards = {"accuracy": {"import": "tests.test_rewards:fragile_accuracy"}}
    if objective == "group_relative":
        rewards["even"] = {"import": "tests.rows:even_tokens", "weight": 0.5}
    stage = _stage(objective=objective, **ONE_STEP, rewards=rewards)
    trainer = trainers.trainer_for(_job(tiny_model, tmp_path / "w", stage))
    trainer.model.train()
    batch = trainer._generate_and_score_completions([trainer.train_dataset[0]] * 16)
    crashed = torch.tensor([int(ids[0]) % 3 == 0 for ids in batch["completion_ids"]])
    assert 0 < crashed.sum() < len(crashed), "the batch needs crashed and scored completions"
    assert (batch["advantages"][crashed] == 0).all()
    if objective == "nsr":
        wrong = ~crashed & (batch["completion_ids"][:, 0] % 2 == 0)
        assert wrong.any() and (batch["advantages"][wrong] == -1).all()
    assert trainer.reward_funcs[0].errors == int(crashed.sum())
    assert trainer._metrics["train"]["rewards/accuracy/errors"] == [float(crashed.sum())]
    assert error_counts(trainer.reward_funcs) == {
        "reward_errors": float(crashed.sum()),
        **{f"reward_errors/{name}": float(crashed.sum()) * (name == "accuracy") for name in rewards},
    }


def test_the_report_counts_unscored_completions_per_reward():
    from rung.report.pipeline import rl_summary

    stage = RLStageParams.model_validate({"rewards": {"accuracy": 1.0, "format": 0.1}})
    line = rl_summary(stage, {"reward_errors": 3.0, "reward_errors/accuracy": 3.0, "reward_errors/format": 0.0})
    assert line["unscored (grader errors)"] == "accuracy 3, format 0"
    # a metrics file from before the per-reward counts
    assert rl_summary(stage, {"reward_errors": 2.0})["unscored (grader errors)"] == "2 in all"


def always_crashes(completions, **_):
    raise ValueError("grader crashed")


def test_groups_no_grader_scored_leave_the_curriculum_alone(tiny_model, tmp_path, monkeypatch):
    """A grader that crashes on everything: every completion unscored (advantage 0), and the online
    pass rates of the pools curriculum stay numbers (a NaN one would stick)."""
    import math

    from rung.rl import trainers
    from tests.test_rl import _job

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    stage = RLStageParams.model_validate(
        {
            "max_steps": 1,
            "num_generations": 2,
            "prompts_per_step": 2,
            "max_completion_length": 4,
            "curriculum": {"type": "pools"},
            "rewards": {
                "accuracy": {"import": "tests.test_rewards:always_crashes"},
                "even": {"import": "tests.rows:even_tokens"},
            },
        }
    )
    trainer = trainers.trainer_for(_job(tiny_model, tmp_path / "w", stage))
    trainer.model.train()
    batch = trainer._generate_and_score_completions([trainer.train_dataset[0]] * 4)
    assert (batch["advantages"] == 0).all() and trainer.reward_funcs[0].errors == 4
    assert not any(math.isnan(r) for r in trainer.batch_source.curriculum.rate)
