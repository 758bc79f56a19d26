"""RL stages on episodes (issue #47): an RL stage whose params name an environment trains episodes from rung's
episode loop (rung.rl.episodes.Episodes as TRL's rollout_func inside rung's GRPO trainer: curriculum, reward logs
and rung's shared-prefix log-probs over TRL's GRPOTrainer; rung.rl.episodes).

On the tiny model memorized to call python(print(17 * 23)) and answer 391 (tests.test_envs), with the real
sandbox: a stage with the retry and one with the python environment train (nonzero loss, weights moved), log the
episode's reward and the per-step episode and echo-trap metrics to MLflow; a resumed stage generates the episodes
of an unkilled one; tool and environment tokens get no gradient; the echo-trap warning fires on a collapsed run
and not on a healthy one."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from transformers import AutoTokenizer

from rung import config, files, models
from rung.config import DifficultyParams, FormatParams, RLStageParams
from rung.envs import template
from rung.errors import InputError
from rung.report import health
from rung.rl import episodes, trainers
from rung.train.jobs import RLJob
from tests.memorize import RETRY, memorize
from tests.test_envs import _memorize
from tests.test_rl import _Crash

FMT = FormatParams(instruction="")  # the prompt the tiny model memorized: the bare question
QUESTION = "What is 17 * 23?"
# 391 right, then wrong (another prompt: rollout_func finds a prompt's columns by the prompt), so that the models
# below, memorized on 17 * 23, earn rewards 1 and 0; retry's third turn on the second, never memorized, varies
ROWS = [
    {"id": "0", "source": "s", "task": "basic_arithmetic", "prompt": QUESTION, "answer": "391", "meta": {}},
    {"id": "1", "source": "s", "task": "basic_arithmetic", "prompt": QUESTION[:-1] + " ?", "answer": "392", "meta": {}},
]
RECORDED: list[list[tuple[Any, ...]]] = []
"""The episodes each reward call saw (`recorded`), per generation call."""


def recorded(completions: list[Any], episode: list[Any], **_: Any) -> list[float]:
    """A reward of weight 0 that records the episodes (their keys, tokens and environment masks)."""
    RECORDED.append([(e.key, e.prompt_ids, e.completion_ids, e.env_mask) for e in episode])
    return [0.0] * len(completions)


def last_turn_parity(completions: list[Any], completion_ids: list[list[int]], **_: Any) -> list[float]:
    """A cheap reward with variance in most groups, on what rung hands the stage's rewards: the last turn."""
    assert all(c[-1]["content"] is not None for c in completions)
    return [float(len(ids) % 2) for ids in completion_ids]


@pytest.fixture(scope="module")
def memorized(tiny_model: Path, tmp_path_factory) -> Path:
    """The tiny model trained to call python(print(17 * 23)) and then answer 391 (tests.test_envs)."""
    tok = template.apply(AutoTokenizer.from_pretrained(tiny_model))
    return _memorize(tiny_model, tok, tmp_path_factory.mktemp("rl_episodes") / "python")


@pytest.fixture(scope="module")
def retrying(tiny_model: Path, tmp_path_factory) -> Path:
    """The tiny model trained to answer 390, and 391 after retry's feedback."""
    tok = template.apply(AutoTokenizer.from_pretrained(tiny_model))
    return memorize(tiny_model, tok, tmp_path_factory.mktemp("rl_episodes") / "retry", RETRY)


@pytest.fixture(autouse=True)
def one_thread():
    """Training on one thread: on 2 shared cores, two torch threads are several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _mlflow_store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")


def _job(model_dir: Path, work: Path, environment: dict, resume: str | None = None, **stage: Any) -> RLJob:
    base = dict(
        max_steps=2,
        num_generations=2,
        prompts_per_step=2,
        max_completion_length=48,  # per turn: the memorized tool call and answer fit
        temperature=1.0,
        learning_rate=1e-3,
        save_steps=1,
        rewards={"accuracy": 1.0, "parity": {"import": "tests.test_rl_episodes:last_turn_parity", "weight": 0.5}},
        environment=environment,
    )
    params = RLStageParams.model_validate({**base, **stage})
    data = work.parent / "rows.jsonl"
    files.write_jsonl(data, ROWS)
    return RLJob(
        key="rl.stages.main",
        init=model_dir,
        data=data,
        work_dir=work,
        format=FMT,
        seed=7,
        dtype="float32",
        params=params,
        buckets=DifficultyParams().buckets,
        curves=work.parent / f"{work.name}.curves.json",
        resume=resume,
        environment=params.environment,
    )


def _train(job: RLJob, callbacks=()) -> tuple[dict[str, float], list[dict[str, float]]]:
    return trainers.train(job, callbacks=list(callbacks)).metrics, files.read_json(job.curves)


@pytest.mark.parametrize(
    "environment, model, stage",
    [
        # warmer: retry's memorized turns vary within a group
        ({"name": "retry", "max_turns": 3}, "retrying", {"temperature": 1.3}),
        # the curriculum and dynamic sampling read each episode's rewards; refills generate more episodes
        (
            {"name": "python", "max_turns": 3},
            "memorized",
            {"curriculum": {"type": "pools"}, "dynamic_sampling": {"max_rounds": 2}},
        ),
    ],
    ids=["retry", "python"],
)
def test_an_rl_stage_trains_episodes_and_logs_them(request, tmp_path, environment, model, stage):
    model_dir = request.getfixturevalue(model)
    job = _job(model_dir, tmp_path / "w", environment, num_generations=4, **stage)
    with mlflow.start_run() as run:
        summary, curves = _train(job)
    assert [c["step"] for c in curves] == [1, 2]
    assert summary["train_loss"] != 0
    moved = models.load(job.work_dir / "final")[0].state_dict()
    start = models.load(model_dir)[0].state_dict()
    assert any(not torch.equal(moved[k], start[k]) for k in start)
    # the episode's reward is the stage's accuracy: the episodes answer 391, right for one row of two
    history = mlflow.MlflowClient().get_metric_history
    rewards = [m.value for m in history(run.info.run_id, "rewards/accuracy/mean")]
    assert [c["accuracy"] for c in curves] == rewards
    assert [c["accuracy_generated"] for c in curves] == pytest.approx([c["episodes/reward"] for c in curves])
    assert 0 < sum(c["accuracy_generated"] for c in curves) < 2
    if environment["name"] == "python":
        assert all(c["episodes/tool_calls_per_episode"] > 0 for c in curves)
        assert all("curriculum/size/normal" in c for c in curves)
        assert any(c["dynamic_sampling_rounds"] > 0 for c in curves)
    else:  # a wrong answer gets the retry feedback: a second turn
        assert all(c["episodes/mean_turns"] > 1 for c in curves)
    for key in (
        "episodes/mean_turns",
        "episodes/tool_calls_per_episode",
        "episodes/cut_at_max_turns",
        "episodes/reward",
        "episodes/group_reward_spread",
        "entropy",
        "frac_reward_zero_std",
    ):
        assert len(history(run.info.run_id, key)) == 2, key
    assert summary["episode_mean_turns"] == pytest.approx(sum(c["episodes/mean_turns"] for c in curves) / 2)
    # rung's loop ran the episodes: its per-turn budget, the stage's whole budget for the episode
    assert max(c["completion_length"] for c in curves) <= 48 * environment["max_turns"]


def test_a_resumed_stage_generates_the_episodes_of_an_unkilled_one(memorized, tmp_path):
    environment = {"name": "python", "max_turns": 3}
    rewards = {"accuracy": 1.0, "recorded": {"import": "tests.test_rl_episodes:recorded", "weight": 0.0}}
    RECORDED.clear()
    _, whole = _train(_job(memorized, tmp_path / "whole", environment, max_steps=3, rewards=rewards))
    unkilled = list(RECORDED)
    RECORDED.clear()
    with pytest.raises(KeyboardInterrupt):
        _train(_job(memorized, tmp_path / "cut", environment, max_steps=3, rewards=rewards), [_Crash(2)])
    cut = tmp_path / "cut" / "checkpoint-2"
    resumed_job = _job(memorized, tmp_path / "cut", environment, str(cut), max_steps=3, rewards=rewards)
    _, resumed = _train(resumed_job)
    assert len(unkilled) == 3 and RECORDED == unkilled  # steps 1 and 2 before the kill, 3 after the resume
    assert len({repr(step) for step in unkilled}) == 3  # each step's episodes its own
    assert any(0 in mask for *_, mask in unkilled[2])  # the episodes called the tool
    assert resumed == whole
    a, _ = models.load(tmp_path / "whole" / "final")
    b, _ = models.load(tmp_path / "cut" / "final")
    for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(x, y)


def _loss_gradient(trainer: trainers.GRPO, batch: dict) -> torch.Tensor:
    """d loss / d log-prob of each completion token, (rows, completion length), for TRL's GRPO loss on `batch`,
    through rung's shared-prefix log-probs (rung.rl.logprobs, through the trainer's hook `token_logps`)."""
    logps: list[torch.Tensor] = []
    token_logps = trainer.token_logps

    def kept(*args, **kwargs):
        out = token_logps(*args, **kwargs)
        assert out is not None, "rung's shared-prefix log-probs did not run"
        out[0].retain_grad()
        logps.append(out[0])
        return out

    trainer.token_logps = kept
    trainer.current_gradient_accumulation_steps = 1  # as transformers' training loop sets it for each window
    trainer.model.zero_grad()
    try:
        trainer.compute_loss(trainer.model, batch).backward()
    finally:
        del trainer.token_logps
    (per_token,) = logps
    return per_token.grad


def test_tool_and_environment_tokens_get_no_gradient(memorized, tmp_path):
    """One batch of real python episodes in the stage's trainer, every completion given a nonzero advantage."""
    job = _job(memorized, tmp_path / "w", {"name": "python", "max_turns": 3}, temperature=0.1)
    trainer = trainers.trainer_for(job)
    trainer.model.train()
    g = trainer.num_generations
    batch = trainer.trl_generation_batch([trainer.train_dataset[i] for i in range(len(ROWS)) for _ in range(g)])
    completion = batch["completion_mask"] == 1
    tool_tokens = (batch["tool_mask"] == 0) & completion  # TRL's tool mask is the loop's env_mask, padded
    model_tokens = (batch["tool_mask"] == 1) & completion
    assert tool_tokens.any(dim=1).all()  # every episode called the tool: its output is in the completion
    # Whatever the rewards, every completion is pushed: a token the loss counts gets a gradient
    batch["advantages"] = torch.tensor([1.0, -1.0] * len(ROWS))
    grad = _loss_gradient(trainer, batch)
    assert grad.shape == completion.shape
    assert torch.all(grad[tool_tokens] == 0)  # exactly: no tool-output token is trained
    assert torch.all(grad[model_tokens] != 0)  # every model token is
    assert torch.all(grad[~completion] == 0)  # nor padding
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())
    # the control: the zeros are the mask's doing; without it the same tokens would be trained
    unmasked = _loss_gradient(trainer, {**batch, "tool_mask": torch.ones_like(batch["tool_mask"])})
    assert torch.all(unmasked[tool_tokens] != 0)


def _curves(reward_std: list[float], entropy: list[float]) -> list[dict[str, float]]:
    return [
        {"step": i + 1, "episodes/reward_std_within": s, "episodes/group_reward_spread": s, "entropy": h}
        for i, (s, h) in enumerate(zip(reward_std, entropy, strict=True))
    ]


def test_the_echo_trap_warning_fires_when_reward_variance_and_entropy_collapse():
    collapsed = episodes.summary(_curves([0.5, 0.45, 0.3, 0.2, 0.05, 0.0], [2.0, 1.9, 1.2, 0.8, 0.4, 0.3]))
    assert collapsed["reward_std_within_first"] == pytest.approx(0.475)
    assert collapsed["entropy_last"] == pytest.approx(0.35)
    (warning,) = health.warnings("rl-main", collapsed)
    assert "echo trap" in warning and "0.475" in warning
    healthy = episodes.summary(_curves([0.5, 0.45, 0.5, 0.4, 0.45, 0.4], [2.0, 1.9, 1.8, 1.8, 1.7, 1.7]))
    assert health.warnings("rl-main", healthy) == []
    # entropy falling while the reward keeps its variance is learning, not the trap; nor is variance alone
    learning = episodes.summary(_curves([0.5, 0.45, 0.5, 0.4, 0.45, 0.4], [2.0, 1.9, 1.2, 0.8, 0.4, 0.3]))
    assert health.warnings("rl-main", learning) == []
    assert health.warnings("rl-main", episodes.summary(_curves([0.5] * 2, [2.0, 0.1]))) == []  # too few steps


def test_group_reward_spread_and_within_group_std():
    spread = episodes.reward_spread([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, None, 1.0], group=2)
    assert spread["reward"] == pytest.approx(4 / 7)
    assert spread["reward_std_within"] == pytest.approx(0.5 / 3)  # groups (1, 1), (0, 0), (1, 0); (None, 1) has one
    assert spread["group_reward_spread"] == pytest.approx(torch.tensor([1.0, 0.0, 0.5, 1.0]).std(unbiased=False))
    assert math.isnan(episodes.reward_spread([None, None], group=2)["reward"])


@pytest.mark.parametrize(
    "stage, expected",
    [
        ({"use_vllm": True}, "rl.stages.main.use_vllm: episodes are sampled by rung's decode loop, not vLLM"),
        ({"trl": {"top_k": 20}}, r"rl.stages.main.trl: \['top_k'\] are not sampled by rung's decode loop"),
    ],
)
def test_params_refuse_what_episodes_cannot_sample(default_params, stage, expected):
    data = {**default_params, "environment": {"name": "retry"}}
    data["rl"]["stages"]["main"] = {**data["rl"]["stages"]["main"], **stage}
    with pytest.raises(config.ConfigError, match=expected):
        config.parse(data)
    data.pop("environment")  # single-turn stages keep them
    if "use_vllm" not in stage:  # (vLLM needs CUDA, checked apart)
        config.parse(data)


def test_the_trainer_refuses_at_stage_start_what_episodes_cannot_sample(tiny_model, tmp_path):
    """The params check's second line (rung.rl.engine), for a job built without it: one line naming the key, as
    the trainer is made, before any rollout."""
    job = _job(tiny_model, tmp_path / "w", {"name": "retry"}, trl={"top_k": 20})
    lacks = r"^rl\.stages\.main: episodes are sampled by rung's decode loop, which lacks \['top_k'\]$"
    with pytest.raises(InputError, match=lacks):
        trainers.trainer_for(job)
