"""Evaluating one eval set as a Prefect task: a task run per set, named for it, its progress in the run's log."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rung.config import EvalParams, FormatParams
from rung.eval import evaluate, rerank

if TYPE_CHECKING:  # types only: torch is imported by whoever loads the model (tasks.generation), after the preflight
    from rung.answers.rows import Row
    from rung.envs.spec import Environment
    from rung.eval.results import SetMetrics
    from rung.generate.completion import Generator


@task(cache_policy=NO_CACHE, task_run_name="eval {name}")
def evaluate_set(
    gen: Generator,
    name: str,
    rows: list[Row],
    fmt: FormatParams,
    params: EvalParams,
    seed: int,
    environment: Environment | None = None,
    scorers: dict[str, rerank.Scorer] | None = None,
) -> tuple[list[Any], list[Any], SetMetrics]:
    """(greedy records, sampled records, metrics) of one eval set: completions, or `environment`'s episodes; the
    samples reranked by `scorers`."""
    log = get_run_logger()

    def progress(message: str) -> None:
        log.info("%s: %s", name, message)

    greedy, sampled, result = evaluate.evaluate(gen, rows, fmt, params, seed, progress, environment)
    if scorers:
        result = rerank.reranked(result, rows, sampled, scorers, params)
        progress(f"samples reranked by {', '.join(scorers)}")
    return greedy, sampled, result
