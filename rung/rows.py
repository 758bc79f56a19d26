"""The curated row: its type, its id, and its metadata as plain JSON (shared by every source)."""
from __future__ import annotations

import hashlib
import json
from typing import Any

Row = dict[str, Any]


def row_id(task: str, prompt: str, answer: str) -> str:
    """Content hash of (task, prompt, answer): stable across runs and machines."""
    return hashlib.sha256(json.dumps([task, prompt, answer]).encode()).hexdigest()[:16]


def _plain(obj: Any) -> Any:
    # Sets (reasoning-gym metadata) become lists; dates, decimals and bytes (Parquet / Arrow cells) their text.
    return list(obj) if isinstance(obj, (set, frozenset)) else str(obj)


def plain_json(obj: Any) -> Any:
    """`obj` as plain JSON values (tuples become lists)."""
    return json.loads(json.dumps(obj, default=_plain))
