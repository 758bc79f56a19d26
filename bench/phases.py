"""Phase timers of an RL step, shared by bench/rl_overhead.py and bench/gpu.py: wrap a TRL trainer's
own methods and split its training time into generation, reward scoring, the rest of the rollout
phase (reference / old log-probs, advantages, rung's curriculum and dynamic-sampling bookkeeping),
the loss forward (log-probs with gradients), backward, and optimizer + logging (the remainder)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

PHASES = ("generation", "rewards", "rollout rest", "loss forward", "backward", "optimizer + rest")


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def instrument(trainer: Any) -> dict[str, float]:
    """Wrap the trainer's phase methods (instance attributes shadow the class's, so calls through
    `self.` are timed once, at the outermost level) and count generated completion tokens."""
    spent: dict[str, float] = defaultdict(float)

    def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _sync()
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            _sync()  # CUDA kernels run asynchronously: charge them to the phase that launched them
            spent[name] += time.perf_counter() - t0
            if name == "generation":
                spent["tokens"] += sum(len(ids) for ids in out[0])
            return out

        return wrapper

    for name, method in (
        ("generation", "_generate_single_turn"),
        ("rewards", "_calculate_rewards"),
        ("rollout", "_generate_and_score_completions"),
        ("loss forward", "compute_loss"),
        ("step", "training_step"),
    ):
        setattr(trainer, method, timed(name, getattr(trainer, method)))
    return spent


def run(name: str, trainer: Any) -> dict[str, Any]:
    spent = instrument(trainer)
    torch.manual_seed(trainer.args.seed)
    t0 = time.perf_counter()
    trainer.train()
    total = time.perf_counter() - t0
    phases = {
        "generation": spent["generation"],
        "rewards": spent["rewards"],
        "rollout rest": spent["rollout"] - spent["generation"] - spent["rewards"],
        "loss forward": spent["loss forward"],
        "backward": spent["step"] - spent["rollout"] - spent["loss forward"],
        "optimizer + rest": total - spent["step"],
    }
    reward = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {
        "contender": name,
        "seconds": total,
        "tokens": int(spent["tokens"]),
        "ms_per_token": 1000 * total / spent["tokens"],
        "phases": phases,
        "steps": trainer.state.global_step,
        "mean_reward": sum(reward) / len(reward),
    }
