"""Reward functions with TRL's signature: (completions, **dataset_columns) -> list[float | None].

`rung.verify` decides correctness; this module turns it into scores. Each factory returns a
picklable callable whose __name__ is its metric key (rl/reward/<name>) and params.yaml name.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rung import answer_format
from rung.config import FormatParams
from rung.verify import is_correct

RewardFunc = Callable[..., list[float | None]]


def _text(completion: Any) -> str:
    # TRL passes conversational completions as [{"role": "assistant", "content": ...}].
    return completion[-1]["content"] if isinstance(completion, list) else completion


class Accuracy:
    """1.0 when the formatted final answer passes the task's verifier, else 0.0."""

    __name__ = "accuracy"

    def __init__(self, fmt: FormatParams):
        self.fmt = fmt

    def __call__(self, completions: list[Any], answer: list[str], task: list[str], prompt_text: list[str], meta: list[str], **_: Any) -> list[float | None]:
        return [
            float(is_correct(answer_format.extract(_text(c), self.fmt), dict(answer=a, task=t, prompt=p, meta=m)))
            for c, a, t, p, m in zip(completions, answer, task, prompt_text, meta, strict=True)
        ]


class Format:
    """1.0 when the completion ends with a non-empty answer line, else 0.0."""

    __name__ = "format"

    def __init__(self, fmt: FormatParams):
        self.fmt = fmt

    def __call__(self, completions: list[Any], **_: Any) -> list[float | None]:
        return [float(answer_format.follows_format(_text(c), self.fmt)) for c in completions]


REGISTRY: dict[str, Callable[[FormatParams], RewardFunc]] = {"accuracy": Accuracy, "format": Format}


def build(weights: dict[str, float], fmt: FormatParams) -> list[RewardFunc]:
    """Reward functions in params order (their weights go to GRPOConfig.reward_weights)."""
    return [REGISTRY[name](fmt) for name in weights]
