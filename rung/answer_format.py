"""The response format, defined once: chat messages, SFT targets and answer extraction.

SFT targets, reward functions and evaluation all go through these functions, so the model is
trained, rewarded and graded on the same format.
"""
from __future__ import annotations

import re

from rung.config import FormatParams


def messages(prompt: str, fmt: FormatParams) -> list[dict[str, str]]:
    """The conversational prompt for one problem (rendered later by the model's chat template)."""
    return [{"role": "system", "content": fmt.system_prompt}, {"role": "user", "content": prompt}]


def target(answer: str, solution: str | None, fmt: FormatParams) -> str:
    """The SFT target: a short worked solution (when there is one), then the answer line."""
    final = f"{fmt.answer_prefix} {answer}"
    return f"{solution.strip()}\n{final}" if solution else final


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def extract(completion: str, fmt: FormatParams) -> str | None:
    """The final answer: the rest of the last line starting with the answer prefix, else None."""
    found = None
    for line in completion.splitlines():
        line = line.strip()
        if line.startswith(fmt.answer_prefix):
            found = line[len(fmt.answer_prefix):].strip()
    return found or None


def extract_lenient(completion: str, fmt: FormatParams) -> str | None:
    """The formatted answer if present, else the last number in the text (for unformatted models)."""
    strict = extract(completion, fmt)
    if strict is not None:
        return strict
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def follows_format(completion: str, fmt: FormatParams) -> bool:
    """True when the completion ends its reasoning with a non-empty answer line."""
    return extract(completion, fmt) is not None
