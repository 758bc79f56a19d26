"""One seed in params.yaml; each stage derives its own so that stages stay independent.

Trainers seed themselves from it (TrainingArguments.seed), generation per batch (rung.generate.api).
"""

from __future__ import annotations

import hashlib


def derive(seed: int, *scope: str) -> int:
    """A stable 31-bit seed for `scope` (e.g. derive(42, "rl", "main")) from the global seed."""
    h = hashlib.sha256(":".join([str(seed), *scope]).encode()).digest()
    return int.from_bytes(h[:4], "big") & 0x7FFFFFFF
