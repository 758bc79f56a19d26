"""The episode loop (rung.envs.loop) as TRL 1.16's `rollout_func`, from values: `rollout_batch` is what it
returns for a batch of prompts, `PromptColumns` finds each prompt's dataset columns (TRL passes the prompts only)
and `EpisodeReward` is the reward function that reads each episode's reward. The trainer's side (seeds, sampling
settings, the model) is rung.rl.episodes'.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from rung.config import SamplingParams
from rung.envs.loop import Sample, run
from rung.envs.spec import Environment
from rung.errors import InputError


def _prompt_key(prompt: Any) -> str:
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


class EpisodeReward:
    """The reward function for `rollout_func`'s episodes, TRL's signature: each episode's reward as the loop
    gave it (`episode_reward`, a column rollout_func returns), None (NaN: unscored) where the grader failed."""

    __name__ = "episode"

    def __call__(self, completions: list[Any], episode_reward: list[float | None], **_: Any) -> list[float | None]:
        return list(episode_reward)


class PromptColumns:
    """The columns of each prompt TRL gives a `rollout_func`, which passes it the prompts only: looked up by the
    prompt among the datasets' rows (train and eval)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.by_prompt: dict[str, dict[str, Any]] = {}
        for row in rows:
            key = _prompt_key(row["prompt"])
            if self.by_prompt.setdefault(key, dict(row)) != dict(row):
                raise InputError(f"two dataset rows share a prompt but not their columns: {key[:200]}")

    def __call__(self, prompts: Sequence[Any]) -> list[dict[str, Any]]:
        try:
            return [self.by_prompt[_prompt_key(p)] for p in prompts]
        except KeyError as e:
            raise InputError(f"rollout_func: a prompt of no dataset row it was given: {e.args[0][:200]}") from None


def rollout_batch(
    generate: Sample,
    tok: PreTrainedTokenizerBase,
    environment: Environment,
    factory: Callable[[], Any],
    columns: Sequence[Mapping[str, Any]],
    *,
    sampling: SamplingParams,
    seed: int,
    group: int,
    max_completion_tokens: int,
    max_context: int | None,
) -> dict[str, Any]:
    """TRL 1.16's `rollout_func` output (GRPOTrainer(rollout_func=..., reward_funcs=[EpisodeReward(), ...]), with
    no `tools` or `environment_factory`: with tools TRL runs its own tool loop and drops `env_mask`) for one
    episode of `environment` per row of `columns`: TRL's sampler puts a prompt's `group` copies side by side, so
    episode i is keyed (prompt of the call, sample) = divmod(i, group), as `per_row` keys (row, sample), and
    evaluation with the call's `seed` draws the same episodes. Each turn at most `sampling.max_new_tokens`
    tokens, `max_completion_tokens` in all, its environment's included.

    Returns TRL's keys (grpo_trainer.py `_generate`): prompt_ids, completion_ids, logprobs (None: TRL recomputes),
    env_mask (TRL's tool mask: environment tokens get no loss), and columns for the reward functions:
    episode_reward (EpisodeReward's input) and episode (the Trajectory)."""
    episodes = run(
        generate,
        tok,
        [factory() for _ in columns],
        columns,
        sampling=sampling,
        max_turns=environment.spec.max_turns,
        seed=seed,
        keys=[divmod(i, group) for i in range(len(columns))],
        max_completion_tokens=max_completion_tokens,
        max_context=max_context,
        turn_seconds=environment.spec.turn_seconds,
    )
    return {
        "prompt_ids": [e.prompt_ids for e in episodes],
        "completion_ids": [e.completion_ids for e in episodes],
        "logprobs": None,
        "env_mask": [e.env_mask for e in episodes],
        "episode_reward": [e.reward for e in episodes],
        "episode": episodes,
    }
