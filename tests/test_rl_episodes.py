"""RL on episodes (issue #47): rung's episode loop (rung.envs.loop.rollout_func) inside rung's GRPO trainer
(rung.rl.trainers.GRPO: curriculum, reward logs and rung's shared-prefix log-probs over TRL's GRPOTrainer).

The loss mask: tool and environment tokens are the environment's text, not the policy's, so the loss must not
train their likelihood. The test takes one generated batch of real python episodes (the tiny model memorized to
call the tool, the real sandbox), gives every completion a nonzero advantage, and backpropagates TRL's GRPO loss
to the per-token log-probabilities the loss is computed from: the gradient is exactly zero at every env_mask 0
token and nonzero at every token the model generated."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from transformers import AutoTokenizer

from rung.config import DifficultyParams, FormatParams, RLStageParams
from rung.envs import check, template
from rung.envs.loop import EpisodeReward, rollout_func
from rung.rl import curricula, trainers
from tests.test_envs import ROW, _memorize

FMT = FormatParams(instruction="")  # the prompt the tiny model memorized: the bare question
# 391 right, then wrong (a prompt apart: rollout_func finds a prompt's columns by the prompt): rewards 1 and 0
ROWS = [ROW, {**ROW, "prompt": [{"role": "user", "content": "What is 17 * 23 ?"}], "answer": "390"}]


@pytest.fixture(scope="module")
def memorized(tiny_model: Path, tmp_path_factory) -> Path:
    """The tiny model trained to call python(print(17 * 23)) and then answer 391 (tests.test_envs)."""
    tok = template.apply(AutoTokenizer.from_pretrained(tiny_model))
    return _memorize(tiny_model, tok, tmp_path_factory.mktemp("rl_episodes") / "model")


@pytest.fixture
def one_thread():
    """Training on one thread: on 2 shared cores, two torch threads are several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _grpo(model_dir: Path, work: Path) -> trainers.GRPO:
    """rung's GRPO trainer over ROWS with python episodes from rung's loop as its rollouts."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    stage = RLStageParams.model_validate(
        dict(max_steps=1, num_generations=2, prompts_per_step=2, max_completion_length=96, temperature=1.0)
    )
    env = check({"name": "python", "max_turns": 3}, tok)
    return trainers.GRPO(
        model=str(model_dir),
        reward_funcs=[EpisodeReward()],
        args=trainers.trl_config(stage, [1.0], seed=0, work_dir=work),
        train_dataset=Dataset.from_list(ROWS),
        processing_class=tok,
        rollout_func=rollout_func(env, FMT, ROWS),
        curriculum=curricula.build(
            ROWS, stage.curriculum, buckets=DifficultyParams().buckets, max_steps=stage.max_steps, seed=0
        ),
        rows=ROWS,
        dynamic_sampling=None,
        objective=stage.objective,
        positive_weight=stage.positive_weight,
    )


def _loss_gradient(trainer: trainers.GRPO, batch: dict) -> torch.Tensor:
    """d loss / d log-prob of each completion token, (rows, completion length), for TRL's GRPO loss on `batch`,
    through rung's shared-prefix log-probs (rung.rl.rollouts.Rollouts.token_logps, the trainer's hook)."""
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


def test_tool_and_environment_tokens_get_no_gradient(memorized, tmp_path, one_thread):
    trainer = _grpo(memorized, tmp_path)
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
