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

from rung.answers import numbers
from rung.answers.rows import Row

# Sentence punctuation only: math symbols at the ends carry meaning ("-5 + 3" is not "5 + 3",
# "(2 + 3) * 4" must keep its bracket), while "Calculate 5 - 3." and "Calculate 5 - 3?" are the
# same problem.
_END_PUNCTUATION = " .,;:!?\"'`"
_TOKEN = re.compile(r"\w+|[^\w\s]")
# A decimal's trailing zeros ("2.50", "3.0"), not in a dotted sequence like "1.2.30" or "2.50.1".
_TRAILING_ZEROS = re.compile(r"(?<![\d.])(\d+)\.(\d*?)0+(?!\d|\.\d)")
# Numbers and arithmetic operators: the part of a math prompt that decides its answer.
_MATH_TOKEN = re.compile(r"\d+(?:\.\d+)?|[-+*/^=<>%]")
# Tokens that continue an arithmetic expression: an eval prompt found inside a train prompt next to
# one of these is part of a longer expression (a different problem), not a copy.
_OPERATORS = frozenset("+-*/^=<>%()[]{}")
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
    kept: list[Row] = []
    removed: Counter[str] = Counter()  # rows dropped per source
    for row, d in zip(rows, drop, strict=True):
        if d:
            removed[row["source"]] += 1
        else:
            kept.append(row)
    return kept, FilterReport(name, sum(removed.values()), reason, dict(sorted(removed.items())))


def normalise(text: str) -> str:
    """Lowercase, collapse whitespace, strip sentence punctuation at both ends, and write numbers one
    way (rung.answers.numbers.plain): thousands separators dropped ("costs $1,000." and "costs $1 000"
    are "costs $1000"), any minus sign as "-", `\\frac{3}{4}` as "3/4", number words as digits ("twelve"
    is "12"), and a decimal's trailing zeros dropped ("2.50" is "2.5", "3.0" is "3"). Unnormalised, such
    numbers would put one problem in different near-duplicate groups (grouped by their numbers), never
    compared."""
    text = numbers.plain(" ".join(text.lower().split()))
    text = _TRAILING_ZEROS.sub(lambda m: f"{m.group(1)}.{m.group(2)}" if m.group(2) else m.group(1), text)
    return text.strip(_END_PUNCTUATION)


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


def _continues(token: str) -> bool:
    """Whether a token next to a match extends an arithmetic expression (a number or an operator)."""
    return token in _OPERATORS or any(c.isdigit() for c in token)


def _contains(tokens: Sequence[str], run: tuple[str, ...]) -> bool:
    """Whether `run` occurs in `tokens` as a whole: not inside a longer expression, so that
    "calculate 5 - 3 . show your work" contains "calculate 5 - 3" and "calculate 5 - 3 * 2" does not
    (nor "calculate 5 - 3 . 5", a decimal)."""
    k = len(run)
    for i in range(len(tokens) - k + 1):
        if tuple(tokens[i : i + k]) != run:
            continue
        before, after = tokens[i - 1] if i else "", tokens[i + k : i + k + 2]
        decimal = after[:1] == ["."] and len(after) == 2 and _continues(after[1])
        if not (before and _continues(before)) and not (after and _continues(after[0])) and not decimal:
            return True
    return False


def _one_problem(shared: list[tuple[tuple[str, ...], int]], n: int) -> bool:
    """Whether eval prompts that share an n-gram (`shared`: each one's tokens and where the n-gram
    starts) put one problem, differently worded around it (another instruction, LaTeX), rather than
    being distinct problems filling one template.

    One problem when they have the same numbers in order (number words are digits after `normalise`; a
    number survives a changed instruction or markup), or when the longest run around the n-gram that they all share
    is more than half of each and holds every number of one of them: the problem itself, next to
    different instructions (which may hold a digit, "in 2 steps"), also when it has no numbers.
    Distinct problems from one template differ in a number (chain_sum's "4 - 1 - 7" and "4 - 1 - 8"),
    or, without numbers, share an instruction shorter than their questions (a heuristic: an
    instruction longer than the questions sharing it counts as their problem, and removes more).
    """
    found = {tuple(t for t in p if t.isdigit()) for p, _ in shared}
    if len(found) == 1 and () not in found:
        return True
    left, right = 0, n  # extend the shared n-gram while every prompt has the same token on that side
    while all(s > left for _, s in shared) and len({p[s - left - 1] for p, s in shared}) == 1:
        left += 1
    while all(s + right < len(p) for p, s in shared) and len({p[s + right] for p, s in shared}) == 1:
        right += 1
    if any(2 * (left + right) <= len(p) for p, _ in shared):
        return False
    return any(all(s - left <= i < s + right for i, t in enumerate(p) if t.isdigit()) for p, s in shared)


def decontaminate(
    rows: list[Row], eval_prompts: list[str], n: int = 8, ignore_templates: bool = True
) -> tuple[list[Row], FilterReport]:
    """Drop train rows whose prompt overlaps an evaluation prompt.

    A row is contaminated if its prompt shares a run of `n` tokens (see `words`) with an eval
    prompt, or contains a whole eval prompt shorter than `n` tokens. Whole means not as part of a
    longer expression: against "Calculate 5 - 3." (4 tokens), "calculate 5-3" and "Calculate 5 - 3.
    Show your work." are copies, while "Calculate 5 - 3 * 2." and "Calculate 5 - 3.5." are other
    problems. An exact copy is caught at any n.

    n = 8 (open-r1's default) because a smaller n matches distinct problems, not copies. With
    n = 3, "5 - 3" is shared by every prompt using those operands, and 1-digit "a op b" has only
    400 forms: measured on reasoning-gym basic_arithmetic (2 terms, 1 digit; 408 distinct train
    prompts against 100 distinct eval prompts), n = 3 removes 258 rows, n = 4 144, n = 5 46,
    n = 6 18 and n = 8 2. At n = 5 "Calculate ( -8 * 5 )." goes because some eval prompt
    contains "( -8 * 5 )"; the 2 at n = 8 are nested variants like "Calculate ( -( 2 + -6 ) )."
    inside "Calculate ( -( -( 2 + -6 ) ) )."

    Not for a generator's own test split: its train and test rows share templates and operands
    by construction (chain_sum: 101 of 366 train rows removed at n = 8, gsm_symbolic: 303 of
    464), and the id-hash split with exact dedup already keeps them apart. Use it for external
    sources against evaluation sets.

    `ignore_templates`: an n-gram shared by distinct eval problems is template text, not a copied
    problem, and is ignored. Without this every chain_sum train row would be removed by an eval set
    containing chain_sum rows: all of them share "state the final answer to the following
    arithmetic problem :" (10 tokens). Eval prompts sharing an n-gram are one problem, not a
    template, when `_one_problem` says so, so that one problem put in several eval sets with
    different instructions (with or without a digit), LaTeX, or numbers written as words does not
    turn its own n-grams into template text and let a reworded training copy through. False keeps
    every n-gram (open-r1's rule).
    """
    if n < 1:
        raise ValueError(f"decontaminate: n must be >= 1, got {n}")
    evals = sorted({tuple(words(p)) for p in eval_prompts})  # a set: a repeated eval prompt counts once
    found: dict[tuple[str, ...], dict[int, int]] = defaultdict(dict)  # n-gram -> {eval prompt: first start}
    for e, toks in enumerate(evals):
        for i in range(len(toks) - n + 1):
            found[toks[i : i + n]].setdefault(e, i)
    index = {
        g
        for g, at in found.items()
        if not ignore_templates or len(at) == 1 or _one_problem([(evals[e], i) for e, i in at.items()], n)
    }
    short = [toks for toks in evals if len(toks) < n]
    tokens = [words(r["prompt"]) for r in rows]
    evals_set = set(evals)
    drop = [
        tuple(t) in evals_set or not index.isdisjoint(_ngrams(t, n)) or any(_contains(t, s) for s in short)
        for t in tokens
    ]
    ignored = " not shared by distinct eval problems" if ignore_templates else ""
    reason = f"same tokens as an eval prompt, contains one shorter than {n} tokens, or shares a {n}-token run{ignored}"
    return _partition(rows, drop, "decontaminate", reason)
