"""The pairs a dpo or kto stage trains on (docs/preference.md): its init model's own samples of the train prompts
graded by the verifier, a right and a wrong completion of one prompt making a pair (rung.rewardmodels.pairs, as the
reward models' verifier pairs), or a preference file's; with the counts of prompts that gave none."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rung.answers.rows import read_rows
from rung.config import FormatParams, PreferenceFile, PreferenceParams
from rung.errors import InputError
from rung.rewardmodels import pairs

PAIRS = "pairs.jsonl"
"""The pairs' file in the stage's published model directory (data/models/rl/<stage>/pairs.jsonl)."""


def build(
    pref: PreferenceParams, gen: Any, prompts: Path, fmt: FormatParams, seed: int, key: str
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The stage's pairs and their counts (prompts, prompts_no_right, prompts_no_wrong, pairs); `gen` samples the
    init (rung.generate; unused for a preference file). No pair at all is an error naming the key."""
    if isinstance(pref.pairs, PreferenceFile):
        made = pairs.read(pref.pairs, f"{key}.pairs")
        stats = {"pairs": len(made)}
    else:
        rows = read_rows(prompts)[: pref.pairs.max_prompts]
        made, stats = pairs.from_graded(pairs.graded(gen, rows, fmt, pref.pairs, seed), pref.pairs, seed)
    if not made:
        raise InputError(f"{key}.pairs: no pair to train on ({stats}); sample more per prompt or from more prompts")
    return made, stats
