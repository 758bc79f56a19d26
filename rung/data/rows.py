"""The curated row's id, its metadata as plain JSON (shared by every source) and its difficulty label; its type is
rung.answers.rows.Row."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from rung.answers.rows import Row


def row_id(task: str, prompt: str, answer: str) -> str:
    """Content hash of (task, prompt, answer): stable across runs and machines."""
    return hashlib.sha256(json.dumps([task, prompt, answer]).encode()).hexdigest()[:16]


def _plain(obj: Any) -> Any:
    # Sets (reasoning-gym metadata) become lists; dates, decimals and bytes (Parquet / Arrow cells) their text.
    return list(obj) if isinstance(obj, (set, frozenset)) else str(obj)


def plain_json(obj: Any) -> Any:
    """`obj` as plain JSON values (tuples become lists)."""
    return json.loads(json.dumps(obj, default=_plain))


def difficulty_label(row: Row) -> str:
    """A row's difficulty for breakdowns: the generator's knob values (reasoning-gym), else a
    'difficulty' or 'level' column of the source, else 'unknown'."""
    meta = row["meta"]
    knobs = [k for k in meta.get("difficulty", {}) if k in meta] if isinstance(meta.get("difficulty"), dict) else []
    if knobs:
        return ",".join(f"{k}={meta[k]}" for k in sorted(knobs))
    for key in ("difficulty", "level"):
        if meta.get(key) not in (None, ""):
            return str(meta[key])
    return "unknown"
