"""Rows of sums for the tests that generate with or train the tiny model: the shape rung.data.curate
writes, so that formatting, grading, traces and curriculum draws all read them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LEVELS = ["unsolved", "hard", "medium", "medium", "solved"]


def sums(count: int, second: Callable[[int], int], *, solutions: bool = False, graded: bool = False) -> list[dict]:
    """`count` basic_arithmetic rows 'Calculate i + second(i).' with ids '0', '1', ...; with
    `solutions`, each its worked solution; with `graded`, a pass rate and a difficulty bucket
    (cycling through every bucket), as the curriculum reads them."""
    rows = []
    for i in range(count):
        b = second(i)
        row: dict[str, Any] = {
            "id": str(i),
            "source": "s",
            "task": "basic_arithmetic",
            "prompt": f"Calculate {i} + {b}.",
            "answer": str(i + b),
        }
        if solutions:
            row["solution"] = f"{i} + {b} = {i + b}"
        row["meta"] = {}
        if graded:
            row |= {"pass_rate": (i % 5) / 4, "bucket": LEVELS[i % 5]}
        rows.append(row)
    return rows


def generator(name: str, task: str, size: int, terms: tuple[int, int], digits: int) -> dict[str, Any]:
    """A reasoning-gym source of params (`curate.sources`): sums of `terms` (min, max) numbers of `digits` digits."""
    config = dict(min_terms=terms[0], max_terms=terms[1], min_digits=digits, max_digits=digits)
    return dict(name=name, task=task, size=size, config=config)


def even_tokens(completion_ids: list[list[int]], **_: Any) -> list[float]:
    """A reward with variance inside every group of a random model, whose completions never stop
    early (so a reward of their length or format is constant): the share of even token ids."""
    return [sum(t % 2 == 0 for t in ids) / len(ids) for ids in completion_ids]
