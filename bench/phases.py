"""Phase timers of an RL step, shared by bench/rl_overhead.py and bench/gpu.py: wrap a TRL trainer's
own methods and split its training time into generation, reward scoring, the rest of the rollout
phase (reference / old log-probs, advantages, rung's curriculum and dynamic-sampling bookkeeping),
the loss forward (log-probs with gradients), backward, checkpoint saves, and optimizer + logging (the
remainder). bench/stage_profile.py times a whole stage's phases with the same timers."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

from rung.train import trl_private

PHASES = (
    "generation",
    "rewards",
    "rollout rest",
    "loss forward",
    "backward",
    "optimizer + rest",
    "checkpoint save",
)
TIMED = ("generation", "rewards", "rollout", "loss forward", "step", "checkpoint save")
"""The trainer's phases (rung.train.trl_private.PHASES) whose methods are timed."""


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(
    spent: dict[str, float], name: str, fn: Callable[..., Any], tokens: Callable[[Any], int] | None = None
) -> Callable[..., Any]:
    """`fn`, adding its wall time to spent[name] (and `tokens` of its result to spent["tokens"])."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _sync()
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        _sync()  # CUDA kernels run asynchronously: charge them to the phase that launched them
        spent[name] += time.perf_counter() - t0
        if tokens is not None:
            spent["tokens"] += tokens(out)
        return out

    return wrapper


def instrument(trainer: Any, spent: dict[str, float] | None = None) -> dict[str, float]:
    """Wrap the trainer's phase methods (instance attributes shadow the class's, so calls through
    `self.` are timed once, at the outermost level; a method the trainer lacks, SFT's rollouts, is
    skipped) and count generated completion tokens; returns `spent` (default: a new one)."""
    spent = defaultdict(float) if spent is None else spent

    def wrap(phase: str, method: Callable[..., Any]) -> Callable[..., Any]:
        count = (lambda out: sum(len(ids) for ids in out[0])) if phase == "generation" else None
        return timed(spent, phase, method, count)

    trl_private.wrap_phases(trainer, wrap, TIMED)
    return spent


def split(spent: dict[str, float], total: float) -> dict[str, float]:
    """A training run's `total` seconds by phase (PHASES) from the timers of `instrument`."""
    return {
        "generation": spent["generation"],
        "rewards": spent["rewards"],
        "rollout rest": spent["rollout"] - spent["generation"] - spent["rewards"],
        "loss forward": spent["loss forward"],
        "backward": spent["step"] - spent["rollout"] - spent["loss forward"],
        "optimizer + rest": total - spent["step"] - spent["checkpoint save"],
        "checkpoint save": spent["checkpoint save"],
    }


def run(name: str, trainer: Any) -> dict[str, Any]:
    spent = instrument(trainer)
    torch.manual_seed(trainer.args.seed)
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    reward = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {
        "contender": name,
        "seconds": total,
        "tokens": int(spent["tokens"]),
        "ms_per_token": 1000 * total / spent["tokens"],
        "phases": split(spent, total),
        "steps": trainer.state.global_step,
        "mean_reward": sum(reward) / len(reward),
    }
