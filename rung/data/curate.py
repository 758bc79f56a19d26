"""Curated data: sources normalised to one row schema, deduplicated and split.

Rows: rung.answers.rows.Row, one JSON object per line, keys sorted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from rung import files, paths
from rung.answers import verify
from rung.answers.rows import Row
from rung.config import CodeSource, CurateParams, EvalParams, ReasoningGymSource, Source
from rung.data import code, filters, generators
from rung.data.rows import difficulty_label
from rung.errors import InputError
from rung.seeding import derive


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


def load_source(src: Source, seed: int) -> tuple[list[Row], dict[str, int]]:
    """Rows of one source and its loading stats."""
    if isinstance(src, ReasoningGymSource | CodeSource):
        rows = (generators if isinstance(src, ReasoningGymSource) else code).load(src, seed)
        return rows, {"read": len(rows), "rows": len(rows)}
    from rung.data import (
        tabular,
    )  # here: datasets and pyarrow, which a reasoning-gym source (and each stage's preflight of one) needs not

    loaded = tabular.load(src, seed)
    if not loaded.rows:
        raise InputError(f"curate.sources.{src.name}: no usable rows (read {loaded.stats['read']})")
    return loaded.rows, loaded.stats


def verifiable(row: Row) -> bool:
    """Whether the configured verifier accepts the row's own reference answer. A math gold math-verify
    fails on (an error, e.g. on 1/0, or a time-out) is one it cannot use; a failing code sandbox fails
    the stage."""
    try:
        return verify.is_correct(row["answer"], row)
    except verify.GraderFailed:
        if row["task"] == verify.MATH:
            return False
        raise


def load_eval_source(src: Source, seed: int) -> tuple[list[Row], dict[str, int]]:
    """`load_source` for an eval set: its errors name eval.sets.<name>, not curate.sources.<name>."""
    try:
        return load_source(src, seed)
    except InputError as e:  # the loaders name the curate section; one rewrite here beats a key argument through each
        raise InputError(str(e).replace(f"curate.sources.{src.name}", f"eval.sets.{src.name}", 1)) from None


def eval_sets(params: EvalParams, seed: int) -> tuple[dict[str, list[Row]], dict[str, dict[str, int]]]:
    """The extra eval sets of params.eval.sets, verified and deduplicated, by name; and per set the
    loader's counts, dropped_unverifiable (golds the verifier cannot use: skipped and counted, as
    open-r1 skips them, never scored as wrong), dropped_duplicate and the rows kept."""
    out, counts = {}, {}
    for src in params.sets:
        rows, loaded = load_eval_source(src, seed)
        rows, unverifiable = filters.unverifiable(rows, verifiable)
        rows, duplicates = filters.exact_duplicates(rows)
        if not rows:
            raise InputError(f"eval.sets.{src.name}: no verifiable rows left")
        out[src.name] = sorted(rows, key=lambda r: r["id"])
        counts[src.name] = {
            **{k: v for k, v in loaded.items() if k != "rows"},
            "dropped_unverifiable": unverifiable.removed,
            "dropped_duplicate": duplicates.removed,
            "rows": len(rows),
        }
    return out, counts


def curate(params: CurateParams, evals: dict[str, list[Row]], seed: int) -> tuple[list[Row], list[Row], dict[str, Any]]:
    """Load every source, filter, mix, split. Returns (train, test, stats).

    Train rows are decontaminated against the extra eval sets (`evals`); the in-domain test split
    is disjoint from train by construction (deduplicated before the split).
    """
    rows, per_source = [], {}
    for src in params.sources:
        src_rows, per_source[src.name] = load_source(src, seed)
        rows += src_rows
    f = params.filters
    reports = []
    steps: list[Callable[[list[Row]], tuple[list[Row], filters.FilterReport]]] = [
        lambda r: filters.unverifiable(r, verifiable),
        lambda r: filters.length_bounds(r, f.min_chars, f.max_chars),
        filters.exact_duplicates,
    ]
    if (threshold := f.near_duplicate_threshold) is not None:
        steps.append(lambda r: filters.near_duplicates(r, threshold=threshold, seed=derive(seed, "curate", "minhash")))
    eval_prompts = [r["prompt"] for rs in evals.values() for r in rs]
    if eval_prompts:
        steps.append(lambda r: filters.decontaminate(r, eval_prompts, n=f.decontamination_ngram))
    for step in steps:
        rows, report = step(rows)
        reports.append(report)
        if not rows:
            raise InputError(f"curate.filters: the {report.filter} filter removed every row ({report.reason})")
    for name, counts in per_source.items():  # golds the verifier cannot use, per source (also under filters)
        counts["dropped_unverifiable"] = reports[0].by_source.get(name, 0)
    if params.mix is not None:
        groups: dict[str, list[Row]] = {}
        for r in rows:
            groups.setdefault(r["source"], []).append(r)
        from rung.data import tabular

        rows = tabular.mix(groups, params.mix.weights, params.mix.total, derive(seed, "curate", "mix"))
    train, test = split(rows, params.test_fraction, params.max_test)
    if not train or not test:
        raise InputError(
            f"curate: split left train={len(train)} test={len(test)} rows; raise sources.size or test_fraction"
        )
    stats = {
        "train": len(train),
        "test": len(test),
        "sources": per_source,
        "filters": [r.as_dict() for r in reports],
        "train_per_source": dict(sorted(Counter(r["source"] for r in train).items())),
        "test_per_source": dict(sorted(Counter(r["source"] for r in test).items())),
        "train_per_difficulty": dict(sorted(Counter(difficulty_label(r) for r in train).items())),
        "with_solution": sum(r["solution"] is not None for r in train),
    }
    return train, test, stats


def histograms(rows: list[Row]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """DVC plot data: rows per (source, prompt length in 10-char bins) and per (source, difficulty)."""
    lengths = Counter((r["source"], len(r["prompt"]) // 10 * 10) for r in rows)
    levels = Counter(f"{r['source']}: {difficulty_label(r)}" for r in rows)
    return (
        [{"source": s, "prompt_chars": n, "rows": c} for (s, n), c in sorted(lengths.items())],
        [{"source_difficulty": k, "rows": c} for k, c in sorted(levels.items())],
    )


def run(params: CurateParams, eval_params: EvalParams, seed: int) -> dict[str, Any]:
    """The curate stage: write train, test, the extra eval sets and the histogram plots at their
    layout paths (each atomically); returns the stats, with the eval sets' counts under eval_sets."""
    evals, eval_counts = eval_sets(eval_params, seed)
    train, test, stats = curate(params, evals, seed)
    stats["eval_sets"] = eval_counts
    files.write_jsonl(paths.TRAIN, train)
    files.write_jsonl(paths.TEST, test)
    lengths, levels = histograms(train)
    files.write_json(paths.plot("curate", "prompt_length"), lengths)
    files.write_json(paths.plot("curate", "difficulty"), levels)
    with files.atomic_path(paths.EVAL_SETS) as tmp:
        tmp.mkdir()
        for name, rows in evals.items():
            files.write_jsonl(tmp / f"{name}.jsonl", rows)
    return stats
