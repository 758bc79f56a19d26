"""What the RL stages need before they start: the tested TRL / transformers versions, a launch that
can run here, vLLM where a stage asks for it, LoRA target modules that the model has, custom
rewards that resolve to callables taking the completions, and custom objectives that resolve to advantage
functions."""

from __future__ import annotations

import inspect

from rung import compat
from rung.checks.models import lora_targets
from rung.config import Params
from rung.errors import InputError
from rung.rl import advantages, reward_models_used, vllm_rollouts
from rung.train import launch


def rl_stages(params: Params) -> None:
    """Per RL stage: the tested trainer versions, its launch, vLLM where asked for, its LoRA targets, its
    custom rewards and objective."""
    compat.check()
    for name, stage in params.rl.stages.items():
        key = f"rl.stages.{name}"
        launch.check(stage.launch, f"{key}.launch")
        if stage.use_vllm:
            # TRL runs vLLM in the training process: vllm in rung's own environment, on CUDA (not
            # generation.vllm's worker environment); server mode's server. The memory share is checked at
            # the stage's start, when its init model exists.
            vllm_rollouts.preflight(stage, None, key)
        lora_targets(stage.lora, params.model, f"{key}.lora")
        for reward, spec in stage.rewards.items():
            if spec.import_path is not None:
                _reward(spec.import_path, bool(spec.args), f"{key}.rewards.{reward}")
            elif reward in reward_models_used.STAGES:
                sections = {
                    "reward_models": params.reward_models,
                    "process_reward_models": params.process_reward_models,
                }
                reward_models_used.check(reward, spec.args, sections, f"{key}.rewards.{reward}")
        advantages.resolve(stage, key)  # an objective given by its import path: loaded, its signature checked


def _reward(path: str, factory: bool, key: str) -> None:
    """A custom reward resolves to a callable that takes the completions (or, with args, a factory)."""
    from rung.rl import rewards  # its registry holds the learned rewards (torch): only for a custom reward

    func = rewards.load_custom(path, key)
    if factory:
        return
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return  # builtins and C callables: nothing to inspect
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params)
    names = {p.name for p in params}
    if not takes_kwargs and not names & {"completions", "completion_ids", "prompts"}:
        raise InputError(
            f"{key}.import: {path!r} must accept completions "
            "(TRL calls reward(prompts=, completions=, completion_ids=, **columns))"
        )
