"""Curated data: sources normalised to one row schema, deduplicated and split.

Row schema (one JSON object per line, keys sorted):
  id        content hash of (task, prompt, answer): stable across runs and machines
  source    the params label of the source
  task      verifier name (a reasoning-gym dataset)
  prompt    the problem text
  answer    the reference answer (string)
  solution  a short worked solution, or null
  meta      the generator's metadata (difficulty knobs), verbatim
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from typing import Any

import reasoning_gym

from rung.config import CurateParams, ReasoningGymSource
from rung.errors import InputError
from rung.seeding import derive
from rung.solutions import arithmetic_steps
from rung.verify import is_known_task

Row = dict[str, Any]


def row_id(task: str, prompt: str, answer: str) -> str:
    return hashlib.sha256(json.dumps([task, prompt, answer]).encode()).hexdigest()[:16]


def _jsonable(obj: Any) -> Any:
    # reasoning-gym metadata holds tuples (difficulty ranges): make it plain JSON.
    return json.loads(json.dumps(obj, default=list))


def from_reasoning_gym(src: ReasoningGymSource, seed: int) -> list[Row]:
    """Generate `src.size` rows of a reasoning-gym task, seeded per source."""
    if not is_known_task(src.task):
        raise InputError(f"curate.sources.{src.name}.task: unknown reasoning-gym task {src.task!r}")
    try:
        dataset = reasoning_gym.create_dataset(src.task, seed=derive(seed, "curate", src.name), size=src.size, **src.config)
    except (TypeError, ValueError, AssertionError) as e:
        raise InputError(f"curate.sources.{src.name}.config: {e}") from None
    rows = []
    for entry in dataset:
        meta = _jsonable(entry["metadata"])
        answer = str(entry["answer"])
        solution = meta.get("answer_cot") or (arithmetic_steps(meta["expression"]) if "expression" in meta else None)
        rows.append(
            dict(id=row_id(src.task, entry["question"], answer), source=src.name, task=src.task,
                 prompt=entry["question"], answer=answer, solution=solution, meta=meta)
        )
    return rows


def normalise_prompt(prompt: str) -> str:
    return " ".join(prompt.lower().split())


def dedup(rows: list[Row]) -> list[Row]:
    """Drop rows whose normalised prompt was seen before (first occurrence wins)."""
    seen: set[str] = set()
    out = []
    for r in rows:
        key = normalise_prompt(r["prompt"])
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def _unit(row: Row) -> float:
    """A uniform number in [0, 1) fixed by the row's id: its split does not depend on other rows."""
    return int(row["id"][:8], 16) / 16**8


def split(rows: list[Row], test_fraction: float, max_test: int) -> tuple[list[Row], list[Row]]:
    """(train, test) by id hash; test capped at `max_test`; both sorted by id."""
    rows = sorted(rows, key=lambda r: r["id"])
    test = [r for r in rows if _unit(r) < test_fraction][:max_test]
    test_ids = {r["id"] for r in test}
    train = [r for r in rows if r["id"] not in test_ids and _unit(r) >= test_fraction]
    return train, test


def curate(params: CurateParams, seed: int) -> tuple[list[Row], list[Row], dict[str, Any]]:
    """Generate every source, dedup, split. Returns (train, test, stats)."""
    generated = [row for src in params.sources for row in from_reasoning_gym(src, seed)]
    unique = dedup(generated)
    train, test = split(unique, params.test_fraction, params.max_test)
    if not train or not test:
        raise InputError(f"curate: split left train={len(train)} test={len(test)} rows; raise sources.size or test_fraction")
    stats = {
        "generated": len(generated),
        "duplicates_removed": len(generated) - len(unique),
        "train": len(train),
        "test": len(test),
        "train_per_source": dict(sorted(Counter(r["source"] for r in train).items())),
        "test_per_source": dict(sorted(Counter(r["source"] for r in test).items())),
        "with_solution": sum(r["solution"] is not None for r in train),
    }
    return train, test, stats
