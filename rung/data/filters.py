"""Row filters of the curate stage: each takes rows and returns (kept rows, FilterReport).

Every filter keeps the order of the rows it keeps and, where rows compete (duplicates), the first
occurrence wins, so the output is a deterministic function of the input order and parameters.
The report says how many rows were removed, by which criterion and from which sources, for the
stage's stats JSON (`FilterReport.as_dict`).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rung.data.rows import Row

# Sentence punctuation only: math symbols at the ends carry meaning ("-5 + 3" is not "5 + 3",
# "(2 + 3) * 4" must keep its bracket), while "Calculate 5 - 3." and "Calculate 5 - 3?" are the
# same problem.
_END_PUNCTUATION = " .,;:!?\"'`"
_TOKEN = re.compile(r"\w+|[^\w\s]")
# Numbers and arithmetic operators: the part of a math prompt that decides its answer.
_MATH_TOKEN = re.compile(r"\d+(?:\.\d+)?|[-+*/^=<>%]")
# (false positive, false negative) weights for choosing the LSH bands: candidates are confirmed
# exactly, so a false positive costs one set comparison and a false negative a missed duplicate.
_LSH_WEIGHTS = (0.01, 0.99)


@dataclass(frozen=True)
class FilterReport:
    """What one filter removed: `removed` rows, for `reason`, `by_source` (source label -> count)."""

    filter: str
    removed: int
    reason: str
    by_source: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form for the stage's stats file."""
        return asdict(self)


def _partition(rows: Iterable[Row], drop: Iterable[bool], name: str, reason: str) -> tuple[list[Row], FilterReport]:
    kept, removed = [], Counter()
    for row, d in zip(rows, drop, strict=True):
        if d:
            removed[row["source"]] += 1
        else:
            kept.append(row)
    return kept, FilterReport(name, sum(removed.values()), reason, dict(sorted(removed.items())))


def normalise(text: str) -> str:
    """Lowercase, collapse whitespace, strip sentence punctuation at both ends."""
    return " ".join(text.lower().split()).strip(_END_PUNCTUATION)


def words(text: str) -> list[str]:
    """Tokens of the normalised text: runs of letters/digits, and every other symbol on its own.

    Splitting symbols off makes "5-3" and "5 - 3", or "problem:" and "problem :", the same tokens,
    which a whitespace split (open-r1) would not.
    """
    return _TOKEN.findall(normalise(text))


# --- unverifiable -----------------------------------------------------------------------------


def unverifiable(rows: list[Row], check: Callable[[Row], bool]) -> tuple[list[Row], FilterReport]:
    """Drop rows for which `check(row)` is False: their reference answer cannot be verified.

    An exception from `check` propagates: a broken checker must fail the stage, not empty it.
    """
    return _partition(
        rows, [not check(r) for r in rows], "unverifiable", "reference answer not checkable by the task's verifier"
    )


# --- length -----------------------------------------------------------------------------------


def length_bounds(rows: list[Row], min_chars: int = 0, max_chars: int | None = None) -> tuple[list[Row], FilterReport]:
    """Keep rows whose prompt has between `min_chars` and `max_chars` characters (inclusive).

    Characters, not tokens: the filter only has to drop degenerate prompts (empty, a stray word)
    and pathological ones (a pasted document), for which characters are within a small factor of
    tokens; the exact token budget is enforced later by the trainers' length limits. Counting
    tokens would make the curated data depend on the model's tokenizer, so changing the model
    would invalidate the curate stage.
    """
    if min_chars < 0 or (max_chars is not None and max_chars < min_chars):
        raise ValueError(f"length_bounds: need 0 <= min_chars <= max_chars, got {min_chars}, {max_chars}")
    upper = float("inf") if max_chars is None else max_chars
    drop = [not min_chars <= len(r["prompt"]) <= upper for r in rows]
    return _partition(rows, drop, "length_bounds", f"prompt length outside [{min_chars}, {max_chars}] characters")


# --- duplicates -------------------------------------------------------------------------------


def exact_duplicates(rows: list[Row]) -> tuple[list[Row], FilterReport]:
    """Drop rows whose normalised prompt (see `normalise`) was seen before; the first one wins."""
    seen: set[str] = set()
    drop = []
    for r in rows:
        key = normalise(r["prompt"])
        drop.append(key in seen)
        seen.add(key)
    return _partition(rows, drop, "exact_duplicates", "same normalised prompt as an earlier row")


def shingles(text: str, n: int) -> set[str]:
    """Character n-grams of the normalised text with whitespace removed (the whole text if shorter).

    Whitespace is dropped so that "5-3" and "5 - 3" shingle alike.
    """
    s = "".join(normalise(text).split())
    return {s[i : i + n] for i in range(len(s) - n + 1)} or {s}


def jaccard(a: set[str], b: set[str]) -> float:
    """|a & b| / |a | b|; two empty sets are identical."""
    return len(a & b) / len(a | b) if a or b else 1.0


def near_duplicates(
    rows: list[Row],
    threshold: float = 0.85,
    num_perm: int = 128,
    ngram: int = 5,
    seed: int = 1,
    same_math: bool = True,
) -> tuple[list[Row], FilterReport]:
    """Drop rows whose prompt is a near-copy of an earlier kept row's prompt (first one wins).

    Similarity is the Jaccard index of character `ngram`-shingles (see `shingles`). Characters,
    not words: arithmetic prompts are a handful of words ("Calculate 5 - 3." has 4), so word
    5-grams would give each such prompt zero or one shingle and a similarity of 0 or 1 with
    nothing in between; character 5-grams give "calculate5-3" eight shingles, and on word
    problems they span about a word, which tolerates typos and re-punctuation.

    MinHash LSH (datasketch, `num_perm` permutations seeded by `seed`, so the same input and
    seed give the same output) finds candidate pairs without comparing all pairs. Its bands are
    tuned for recall (a pair at exactly `threshold` is a candidate with probability 0.97 at the
    defaults, against 0.46 with datasketch's balanced default), because every candidate is then
    confirmed with the exact Jaccard index: no pair below `threshold` is ever removed.

    With `same_math` a pair must also have the same sequence of numbers and operators: a
    procedural template makes distinct problems look alike, e.g. reasoning-gym chain_sum's
    "State the final answer to the following arithmetic problem: 4 - 1 - 7 =" and the same with
    "4 - 1 - 8 =" have a shingle Jaccard of 0.93, yet different answers. Measured on 366 distinct
    chain_sum train rows at the defaults: 346 removed without `same_math`, none with it. Rows are
    compared only within a group of equal sequences, so templated data is not compared all
    against all.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"near_duplicates: threshold must be in (0, 1], got {threshold}")
    from datasketch import (
        MinHash,
        MinHashLSH,
    )  # here: only curate deduplicates, every stage's preflight imports rung.data.curate

    groups: dict[tuple[str, ...], list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        groups[tuple(_MATH_TOKEN.findall(normalise(r["prompt"]))) if same_math else ()].append(i)
    drop = [False] * len(rows)
    for members in (m for m in groups.values() if len(m) > 1):
        sets = {i: shingles(rows[i]["prompt"], ngram) for i in members}
        # bulk() draws the seeded permutations once for the whole group.
        hashes = MinHash.bulk([[s.encode() for s in sorted(sets[i])] for i in members], num_perm=num_perm, seed=seed)
        lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=_LSH_WEIGHTS)
        for i, mh in zip(members, hashes, strict=True):  # members are in row order: the first occurrence wins
            drop[i] = any(jaccard(sets[i], sets[j]) >= threshold for j in lsh.query(mh))
            if not drop[i]:
                lsh.insert(i, mh)
    reason = f"character {ngram}-gram Jaccard >= {threshold} with an earlier row" + (
        " with the same numbers and operators" if same_math else ""
    )
    return _partition(rows, drop, "near_duplicates", reason)


# --- decontamination --------------------------------------------------------------------------


def _ngrams(tokens: Sequence[str], n: int) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}


def decontaminate(
    rows: list[Row], eval_prompts: list[str], n: int = 8, template_prompts: int | None = 2
) -> tuple[list[Row], FilterReport]:
    """Drop train rows whose prompt overlaps an evaluation prompt.

    A row is contaminated if its prompt has the same tokens (see `words`) as an eval prompt, or if
    the two share a run of `n` tokens. A prompt shorter than `n` tokens has no n-gram, so only the
    whole-prompt comparison applies to it: "Calculate 5 - 3." (4 tokens) matches an identical
    eval prompt, and "Calculate 5 - 3 * 2." is kept (a different problem, not a copy).

    n = 8 (open-r1's default) because a smaller n matches distinct problems, not copies. With
    n = 3, "5 - 3" is shared by every prompt using those operands, and 1-digit "a op b" has only
    400 forms: measured on reasoning-gym basic_arithmetic (2 terms, 1 digit; 408 distinct train
    prompts against 100 distinct eval prompts), n = 3 removes 258 rows, n = 4 144, n = 5 46,
    n = 6 18 and n = 8 2. At n = 5 "Calculate ( -8 * 5 )." goes because some eval prompt
    contains "( -8 * 5 )"; the 2 at n = 8 are nested variants like "Calculate ( -( 2 + -6 ) )."
    inside "Calculate ( -( -( 2 + -6 ) ) )." Exact copies are caught at any n by the whole-prompt
    comparison.

    Not for a generator's own test split: its train and test rows share templates and operands
    by construction (chain_sum: 101 of 366 train rows removed at n = 8, gsm_symbolic: 303 of
    464), and the id-hash split with exact dedup already keeps them apart. Use it for external
    sources against evaluation sets.

    `template_prompts`: an n-gram found in at least this many distinct eval prompts is template
    text, not a copied problem, and is ignored. Without this every chain_sum train row would be
    removed by an eval set containing chain_sum rows: all of them share "state the final answer
    to the following arithmetic problem :" (10 tokens). None keeps every n-gram (open-r1's rule);
    with a single eval prompt nothing can be recognised as template.
    """
    if n < 1:
        raise ValueError(f"decontaminate: n must be >= 1, got {n}")
    evals = {tuple(words(p)) for p in eval_prompts}  # a set: a repeated eval prompt counts once
    seen_in = Counter(g for toks in evals for g in _ngrams(toks, n))
    index = {g for g, c in seen_in.items() if template_prompts is None or c < template_prompts}
    tokens = [words(r["prompt"]) for r in rows]
    drop = [tuple(t) in evals or not index.isdisjoint(_ngrams(t, n)) for t in tokens]
    ignored = "" if template_prompts is None else f" found in fewer than {template_prompts} eval prompts"
    reason = f"same tokens as an eval prompt, or a shared {n}-token run{ignored}"
    return _partition(rows, drop, "decontaminate", reason)
