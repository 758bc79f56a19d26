"""Preference pairs: from the init model's own samples graded by the verifier (a right and a wrong completion of
one prompt), or from a file / dataset with prompt, chosen and rejected; and the held-out split by prompt."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rung import files
from rung.answers import formats
from rung.answers.rows import Problem, Row
from rung.answers.verify import is_correct
from rung.config import FormatParams, PreferenceFile, VerifierPairs
from rung.errors import InputError

if TYPE_CHECKING:  # types only: torch is imported by whoever loads the model (tasks.generation)
    from rung.generate.completion import Generator

COLUMNS = ("prompt", "chosen", "rejected")


def right(text: str, row: Problem, fmt: FormatParams) -> bool:
    """Whether a completion is right, as the accuracy reward grades it (the answer where the format puts it):
    the one place the learned-reward stages call the verifier."""
    return is_correct(formats.extract(text, fmt), row)


def graded(
    gen: Generator, rows: list[Row], fmt: FormatParams, params: VerifierPairs, seed: int
) -> list[dict[str, Any]]:
    """Each row's `samples_per_prompt` completions, each graded as the accuracy reward grades it (the answer
    where the format puts it), with the row's difficulty bucket."""
    prompts = gen.render([formats.prompt(r["prompt"], fmt) for r in rows])
    samples = gen.generate(prompts, params.sampling, n=params.samples_per_prompt, seed=seed, desc="reward pairs")
    return [
        {
            "id": row["id"],
            "prompt": row["prompt"],
            "bucket": row.get("bucket", "all"),
            "completions": [{"text": c.text, "right": right(c.text, row, fmt)} for c in done],
        }
        for row, done in zip(rows, samples, strict=True)
    ]


def of_prompt(row: dict[str, Any], params: VerifierPairs, rng: random.Random) -> list[dict[str, Any]]:
    """A graded prompt's pairs: (right, wrong) combinations of its completions, `pairs_per_prompt` at most,
    drawn at random or taken in sample order (`choose`); none where no completion is right or none wrong."""
    good = [c["text"] for c in row["completions"] if c["right"]]
    bad = [c["text"] for c in row["completions"] if not c["right"]]
    combos = list(itertools.product(good, bad))
    if params.choose == "random":
        combos = rng.sample(combos, min(params.pairs_per_prompt, len(combos)))
    return [
        {"id": row["id"], "prompt": row["prompt"], "bucket": row["bucket"], "chosen": c, "rejected": r}
        for c, r in combos[: params.pairs_per_prompt]
    ]


def from_graded(rows: list[dict[str, Any]], params: VerifierPairs, seed: int) -> tuple[list[dict], dict[str, int]]:
    """Every graded prompt's pairs, and the counts that say where pairs were lost: prompts with no right
    completion, prompts with no wrong one."""
    rng = random.Random(seed)
    out = [p for row in rows for p in of_prompt(row, params, rng)]
    rights = [sum(c["right"] for c in row["completions"]) for row in rows]
    stats = {
        "prompts": len(rows),
        "prompts_no_right": sum(r == 0 for r in rights),
        "prompts_no_wrong": sum(r == len(row["completions"]) for r, row in zip(rights, rows, strict=True)),
        "pairs": len(out),
    }
    return out, stats


Made = tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]] | None, dict[str, int]]
"""(train pairs, held-out pairs, held-out graded samples or None, counts)."""


def from_samples(graded: list[dict[str, Any]], params: VerifierPairs, fraction: float, seed: int, key: str) -> Made:
    """Verifier pairs split by prompt: the train prompts' pairs (with the counts of prompts that gave none), the
    held-out prompts' pairs and their graded samples (for AUROC)."""
    train_rows, held_rows = split(graded, fraction, seed, key)
    train, stats = from_graded(train_rows, params, seed)
    held, _ = from_graded(held_rows, params, seed)
    return train, held, held_rows, stats


def from_file(source: PreferenceFile, fraction: float, seed: int, key: str) -> Made:
    """A preference file's pairs split by prompt id; no graded samples."""
    train, held = split(read(source, key), fraction, seed, key)
    return train, held, None, {"pairs": len(train) + len(held)}


def read(source: PreferenceFile, key: str, load: Callable[..., Any] | None = None) -> list[dict[str, Any]]:
    """The pairs of a .jsonl file, a local dataset directory or a hub dataset (`datasets.load_dataset`; `load`
    replaces it in tests), each with an id; a missing column or an empty text is one line naming the key."""
    path = Path(source.path)
    if path.suffix in (".jsonl", ".ndjson"):
        if not path.is_file():
            raise InputError(f"{key}.path: {path} not found")
        rows = files.read_jsonl(path)
    else:
        if load is None:
            from datasets import load_dataset

            load = load_dataset
        rows = list(load(source.path, split=source.split))
    rows = rows[: source.max_pairs]
    if not rows:
        raise InputError(f"{key}.path: {source.path} holds no pairs")
    for i, row in enumerate(rows):
        bad = [c for c in COLUMNS if not isinstance(row.get(c), str) or not row[c]]
        if bad:
            raise InputError(f"{key}.path: {source.path} row {i} has no text in column(s) {', '.join(bad)}")
    return [{"id": str(row.get("id", i)), **{c: row[c] for c in COLUMNS}} for i, row in enumerate(rows)]


def split(items: list[dict[str, Any]], fraction: float, seed: int, key: str) -> tuple[list[dict], list[dict]]:
    """(train, held-out) by prompt id, a seeded `fraction` of the ids held out (at least one, and one left to
    train on): a prompt's pairs and completions never fall on both sides."""
    ids = sorted({i["id"] for i in items})
    if len(ids) < 2:
        raise InputError(f"{key}: {len(ids)} prompt(s) cannot be split into a train and a held-out part")
    held = set(random.Random(seed).sample(ids, min(len(ids) - 1, max(1, round(fraction * len(ids))))))
    return [i for i in items if i["id"] not in held], [i for i in items if i["id"] in held]
