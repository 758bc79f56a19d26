"""A batch of completions as TRL gives it to the rewards: each completion's text, each prompt's group."""

from __future__ import annotations

from typing import Any


def text(completion: Any) -> str:
    """TRL passes conversational completions as [{"role": "assistant", "content": ...}], plain ones as text."""
    return completion[-1]["content"] if isinstance(completion, list) else completion


def groups(n: int, size: int) -> list[range]:
    """The positions of each prompt's completions in a batch of n: TRL lays a prompt's generations out
    contiguously, num_generations (`size`) at a time."""
    return [range(start, min(start + size, n)) for start in range(0, n, size)]
