"""The row: the curated row's type (rung.data writes it, every stage reads it), the part of it the grader reads,
and its columns in an RL trainer's dataset, derived and read back here only.

Here, beside the grader, rather than in rung.data: the environments (below rung.data) read a dataset row back
into what the grader grades (tests/test_layers.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NotRequired, TypedDict, cast

from rung import files
from rung.answers import formats
from rung.config import FormatParams


class Problem(TypedDict):
    """What the grader reads of a row (rung.answers.verify.is_correct)."""

    task: str
    """The verifier: a reasoning-gym dataset, math (math-verify) or code (tests in rung.sandbox)."""
    prompt: str
    """The problem text."""
    answer: str
    """The reference answer."""
    meta: dict[str, Any]
    """The generator's metadata (difficulty knobs), verbatim; a code row's tests and entry point."""


class Row(Problem):
    """A curated row (rung.data.curate: one JSON object per line, keys sorted)."""

    id: str
    """Content hash of (task, prompt, answer): stable across runs and machines."""
    source: str
    """The params label of the source."""
    solution: NotRequired[str | None]
    """A short worked solution, or null."""
    pass_rate: NotRequired[float]
    """The difficulty stage's (its filtered train set only)."""
    bucket: NotRequired[str]


class DatasetRow(TypedDict):
    """A row's columns in an RL stage's dataset: TRL passes them to the reward functions and `reset(**columns)`."""

    prompt: formats.Prompt
    """The problem as the format puts it to the model."""
    prompt_text: str
    """The problem text (the grader's `prompt`: reasoning-gym scorers may read the question)."""
    answer: str
    task: str
    meta: str
    """`meta` as JSON: HF datasets give a column one schema for all rows, and the metas of two tasks differ."""


def read_rows(path: Path | str) -> list[Row]:
    """The curated rows a data stage wrote (rung.data.curate, rung.data.difficulty): read back as written."""
    return cast(list[Row], files.read_jsonl(path))


def dataset_row(row: Problem, fmt: FormatParams) -> DatasetRow:
    """The columns of `row` in an RL stage's dataset."""
    return DatasetRow(
        prompt=formats.prompt(row["prompt"], fmt),
        prompt_text=row["prompt"],
        answer=row["answer"],
        task=row["task"],
        meta=files.dumps(row["meta"]),
    )


def problem(columns: Mapping[str, Any]) -> Problem:
    """What the grader reads, from a dataset row's columns (dataset_row) or a curated row's, its prompt as text or
    as the messages the format made of it (the problem is then the last user turn's text)."""
    prompt = columns.get("prompt_text")
    if prompt is None:
        prompt = columns.get("prompt")
        if not isinstance(prompt, str):
            prompt = next(m["content"] for m in reversed(prompt or []) if m.get("role") == "user")
    meta = columns.get("meta") or {}
    return Problem(
        task=columns["task"],
        prompt=prompt,
        answer=columns["answer"],
        meta=json.loads(meta) if isinstance(meta, str) else dict(meta),
    )
