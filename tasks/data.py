from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rung import data, io, layout
from rung.config import CurateParams, EvalParams


@task(cache_policy=NO_CACHE)
def curate(params: CurateParams, eval_params: EvalParams, seed: int) -> dict[str, Any]:
    """Load, filter and split the sources; write train, test and the extra eval sets; returns stats."""
    evals = data.eval_sets(eval_params, seed)
    train, test, stats = data.curate(params, evals, seed)
    io.write_jsonl(layout.TRAIN, train)
    io.write_jsonl(layout.TEST, test)
    lengths, levels = data.histograms(train)
    io.write_json(layout.plot("curate", "prompt_length"), lengths)
    io.write_json(layout.plot("curate", "difficulty"), levels)
    with io.atomic_path(layout.EVAL_SETS) as tmp:
        tmp.mkdir()
        for name, rows in evals.items():
            io.write_jsonl(tmp / f"{name}.jsonl", rows)
    get_run_logger().info("curated %d train / %d test rows, %d extra eval sets", stats["train"], stats["test"], len(evals))
    return stats
