"""Everything about an experiment that can be checked without training, checked before any compute:
by `rung validate`, `make demo` / `make pipeline`, `rung run`, and before a sweep or study is queued.
Each failure is one InputError naming the params key (with the stage's real name) or file. A stage
runs only the checks of what it runs (its flow's CHECKS), so its DVC deps stay its own imports."""

from __future__ import annotations

from rung.checks import environments, generation, models, rerank, rewardmodels, rl, sources, training
from rung.config import Params

# in the order the stages run
ALL = (
    models.base_model,
    sources.sources,
    environments.environments,
    models.trace_models,
    models.difficulty_reference,
    generation.backend,
    training.sft_launch,
    rewardmodels.reward_models,
    rewardmodels.process_reward_models,
    rl.rl_stages,
    rerank.rerank,
)


def check(params: Params) -> None:
    """Raise InputError at the first thing that would make a stage fail on its input."""
    for one in ALL:
        one(params)
