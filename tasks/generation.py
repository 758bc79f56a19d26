from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rung import difficulty, evaluate, generation, traces
from rung.config import DifficultyParams, EvalParams, FormatParams


@task(cache_policy=NO_CACHE)
def score_difficulty(model_dir: Path, rows: list[dict[str, Any]], fmt: FormatParams, params: DifficultyParams, dtype: str, backend: str, seed: int) -> list[dict[str, Any]]:
    """Per-prompt pass rates of the reference model."""
    scores = difficulty.pass_rates(generation.load(model_dir, dtype, backend), rows, fmt, params, seed)
    get_run_logger().info("scored %d prompts x %d rollouts", len(rows), params.num_generations)
    return scores


@task(cache_policy=NO_CACHE)
def evaluate_checkpoint(model_dir: Path, sets: dict[str, list[dict[str, Any]]], fmt: FormatParams, params: EvalParams, dtype: str, backend: str, seed: int) -> dict[str, tuple[list[Any], list[Any], dict[str, Any]]]:
    """(greedy records, sampled records, metrics) of one checkpoint on every eval set."""
    log = get_run_logger()
    gen = generation.load(model_dir, dtype, backend)
    return {name: evaluate.evaluate(gen, rows, fmt, params, seed, progress=lambda m, n=name: log.info("%s: %s", n, m)) for name, rows in sets.items()}


@task(cache_policy=NO_CACHE)
def build_traces(rows: list[dict[str, Any]], sources: list[Any], fmt: FormatParams, dtype: str, backend: str, seed: int, locate: Callable[[str], Path | str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """SFT traces of every source; sampled sources load their model (base or teacher) once."""
    loaded: dict[str, generation.Generator] = {}

    def load(model: str) -> generation.Generator:
        if model not in loaded:
            loaded[model] = generation.load(locate(model), dtype, backend)
        return loaded[model]

    out, stats = traces.build(rows, sources, fmt, seed, load)
    get_run_logger().info("%d SFT traces: %s", len(out), stats)
    return out, stats
