"""RL stages on episodes (issue #47): what rung.rl.trainers adds to a GRPO stage whose params name an environment
(`params.environment_of(stage)`). The single-turn stage does not come here.

- Rollouts: rung's one episode loop as TRL's `rollout_func` (`Episodes`, rung.envs.loop: env_mask becomes TRL's
  tool mask, so tool and environment tokens get no loss; each call seeded by (seed, step, call of the step,
  process), so a resumed run reproduces an unkilled one's episodes). The stage's `max_completion_length` is per
  assistant turn; an episode holds at most `max_completion_length * max_turns` tokens, its environment's
  included (GRPOConfig.max_completion_length: rung.envs.loop.budget, as evaluation and difficulty scoring).
- Rewards (`rewards`): the stage's `accuracy` entry is scored by the episode's own reward (the final answer by
  the task's verifier, retry's discount per extra turn, or a class's `get_reward()`), at its weight; a stage
  without `accuracy` trains on the episode's reward as one more function, `episode`, weight 1 (as TRL appends
  `get_reward`). Every other configured reward (format, overlong, custom ones) scores the episode's last
  assistant turn, the answer, as it scores a single-turn completion: a format reward on the whole episode would
  read the tool's output and the environment's replies as the model's. An environment that gives no reward
  (neither a built-in nor a `get_reward`) has `accuracy` score the last turn too.
- Per-step metrics (`log_step`), under `episodes/`: those of an eval set's episodes (rung.eval.episodes: mean
  turns, tool calls per episode, tool error rate, share cut at max_turns, success within t turns, first-answer
  accuracy) over every episode generated in the step, the mean episode reward, and the echo-trap signals
  (RAGEN / StarPO): the within-group std of the episode reward, averaged over groups, and the spread (std) of
  the groups' mean rewards; TRL logs the policy's entropy. `summary` condenses them for rung.report.health.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from statistics import mean
from typing import Any

import torch
from accelerate.utils import gather_object

from rung.config import FormatParams, RLStageParams
from rung.envs import Environment
from rung.envs.loop import sampler
from rung.envs.rollout_func import EpisodeReward, PromptColumns, rollout_batch
from rung.envs.trajectory import Trajectory
from rung.eval.episodes import metrics
from rung.generate.api import positions
from rung.rl.engine import RolloutEngine
from rung.rl.rewards import Guarded, RewardFunc, build
from rung.train.trl_private import train_metrics

PREFIX = "episodes/"
STEP_METRICS = (
    "mean_turns",
    "tool_calls_per_episode",
    "tool_error_rate",
    "cut_at_max_turns",
    "truncated",
    "first_answer_accuracy",
)
"""Of rung.eval.episodes.EpisodeMetrics, logged per step as episodes/<name> (and success_within_<t>)."""
ECHO = {
    "reward_std_within": PREFIX + "reward_std_within",
    "group_reward_spread": PREFIX + "group_reward_spread",
    "entropy": "entropy",  # TRL's: the policy's mean token entropy over the tokens it trains (the model's)
}
"""The echo-trap curves `summary` compares between a run's first and last third: name -> log key."""


class LastTurn:
    """A reward function with TRL's signature that scores an episode's last assistant turn (its text and its
    token ids) in place of the whole completion, which also holds the tool outputs and the environment's replies.
    The episodes reach it as TRL passes rollout_func's columns (`episode`), and it passes them on."""

    def __init__(self, func: RewardFunc):
        self.func = func

    def __call__(self, completions: list[Any], episode: list[Trajectory], **kwargs: Any) -> list[float | None]:
        kwargs.pop("completion_ids", None)
        return self.func(
            completions=[[{"role": "assistant", "content": e.turns[-1]["text"]}] for e in episode],
            completion_ids=[e.completion_ids[len(e.completion_ids) - e.turns[-1]["tokens"] :] for e in episode],
            episode=episode,
            **kwargs,
        )


def rewards(
    stage: RLStageParams, fmt: FormatParams, environment: Environment, key: str
) -> tuple[list[Guarded], list[float]]:
    """The stage's reward functions and weights on episodes (module docstring)."""

    def on_episodes(name: str, func: RewardFunc) -> RewardFunc:
        builtin_accuracy = name == "accuracy" and stage.rewards[name].import_path is None
        return EpisodeReward() if builtin_accuracy and environment.scores else LastTurn(func)

    funcs, weights = build(stage, fmt, key, wrap=on_episodes)
    if environment.scores and "accuracy" not in stage.rewards:
        funcs.append(Guarded(EpisodeReward(), EpisodeReward.__name__, stage.num_generations))
        weights.append(1.0)
    return funcs, weights


class Episodes:
    """TRL's rollout_func for a stage on episodes: `environment`'s episodes for the datasets' `rows` (rung.envs.loop,
    `rollout_batch`), each turn at most `turn_tokens` tokens (None: the trainer's max_completion_length), each
    call's episodes logged (`log_step`). The trainer's side comes from its rollout engine (rung.rl.engine: seeds
    scoped "episodes", sampling settings, the unwrapped model): rung's trainer's own, checked at stage start; a
    plain TRL GRPOTrainer's is built at its first call, its refusals named under `key`."""

    def __init__(
        self,
        environment: Environment,
        fmt: FormatParams,
        rows: Iterable[Mapping[str, Any]],
        turn_tokens: int | None = None,
        key: str = "GRPOConfig",
    ) -> None:
        self.environment, self.turn_tokens, self.key = environment, turn_tokens, key
        self.columns = PromptColumns(rows)
        self.factory = environment.factory(fmt)
        self.engines: dict[int, RolloutEngine] = {}
        """A plain trainer's engine, by the trainer's id."""

    def engine(self, trainer: Any) -> RolloutEngine:
        own = getattr(trainer, "rollouts", None)
        if isinstance(own, RolloutEngine):
            return own
        if id(trainer) not in self.engines:
            self.engines[id(trainer)] = RolloutEngine.of(trainer, "episodes", self.key, episodes=True)
        return self.engines[id(trainer)]

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, Any]:
        engine = self.engine(trainer)
        columns = self.columns(prompts)
        seed, settings = engine.seed(), engine.settings
        sampling = engine.sampling(self.turn_tokens or settings.max_completion_length, len(prompts))
        with engine.decoding() as model:
            out = rollout_batch(
                sampler(model, settings.eos_token_ids),
                trainer.processing_class,
                self.environment,
                self.factory,
                columns,
                sampling=sampling,
                seed=seed,
                group=settings.num_generations,
                max_completion_tokens=settings.max_completion_length,
                max_context=positions(model),
            )
        log_step(trainer, out["episode"], self.environment.spec.max_turns)
        return out


def rollouts(
    environment: Environment, fmt: FormatParams, rows: Sequence[Mapping[str, Any]], stage: RLStageParams, key: str
) -> Episodes:
    """TRL's rollout_func for the stage (params `key`): each turn at most the stage's max_completion_length."""
    return Episodes(environment, fmt, rows, turn_tokens=stage.max_completion_length, key=key)


def log_step(trainer: Any, trajectories: list[Trajectory], max_turns: int) -> None:
    """The step's episode metrics (module docstring) over every process's episodes; TRL averages a step's
    generation calls (dynamic sampling's refills) into its log."""
    # gathered as records: an episode's live environment need not pickle
    episodes = [Trajectory.model_validate(r) for r in gather_object([t.dump() for t in trajectories])]
    logged = train_metrics(trainer)
    flat = metrics(episodes, max_turns).flat()
    for name in (*STEP_METRICS, *(f"success_within_{t}" for t in range(1, max_turns + 1))):
        if flat[name] is not None:
            logged[PREFIX + name].append(float(flat[name]))
    for name, value in reward_spread([e.reward for e in episodes], trainer.num_generations).items():
        if not math.isnan(value):
            logged[PREFIX + name].append(value)


def reward_spread(rewards: list[float | None], group: int) -> dict[str, float]:
    """The mean episode reward, the within-group std averaged over groups and the std of the group means, over
    the scored episodes (an unscored one is NaN, as in TRL); groups are `group` consecutive episodes."""
    r = torch.tensor([math.nan if x is None else float(x) for x in rewards], dtype=torch.float64)
    out = {"reward": r.nanmean().item()}
    if len(r) % group:
        return out
    groups = r.view(-1, group)
    scored = (~groups.isnan()).sum(dim=1)
    means = groups.nanmean(dim=1)
    # population std within a group (a group of one scored episode has none: left out)
    within = ((groups - means[:, None]) ** 2).nanmean(dim=1).sqrt()[scored > 1]
    spread = means[~means.isnan()]
    out["reward_std_within"] = within.mean().item() if len(within) else math.nan
    out["group_reward_spread"] = spread.std(unbiased=False).item() if len(spread) > 1 else math.nan
    return out


def summary(curves: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """A stage's summary metrics on episodes from its per-step curves (rung.rl.trainers.train): each episode
    curve's mean over the run (`episode_<name>`), and each echo-trap curve's mean over the first and the last
    third of the steps (`<name>_first`, `<name>_last`), which rung.report.health compares."""
    out: dict[str, float] = {}
    for name in ("reward", "mean_turns", "tool_calls_per_episode", "cut_at_max_turns"):
        values = [c[PREFIX + name] for c in curves if PREFIX + name in c]
        if values:
            out[f"episode_{name}"] = mean(values)
    for name, key in ECHO.items():
        values = [c[key] for c in curves if key in c]
        if len(values) < 3:
            continue
        third = len(values) // 3
        out[f"{name}_first"], out[f"{name}_last"] = mean(values[:third]), mean(values[-third:])
    return out
