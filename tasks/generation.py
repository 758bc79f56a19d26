from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rung import difficulty, evaluate, models
from rung.config import DifficultyParams, FormatParams, SamplingParams


@task(cache_policy=NO_CACHE)
def score_difficulty(model_dir: Path, rows: list[dict[str, Any]], fmt: FormatParams, params: DifficultyParams, dtype: str, seed: int) -> list[dict[str, Any]]:
    """Per-prompt pass rates of the reference model."""
    model, tok = models.load(model_dir, dtype)
    scores = difficulty.pass_rates(model, tok, rows, fmt, params, seed)
    get_run_logger().info("scored %d prompts x %d rollouts", len(rows), params.num_generations)
    return scores


@task(cache_policy=NO_CACHE)
def evaluate_checkpoint(model_dir: Path, rows: list[dict[str, Any]], fmt: FormatParams, sampling: SamplingParams, dtype: str, seed: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-sample records and metrics of one checkpoint on `rows`."""
    model, tok = models.load(model_dir, dtype)
    records, metrics = evaluate.evaluate(model, tok, rows, fmt, sampling, seed)
    get_run_logger().info("%s: accuracy %.3f, format rate %.3f", model_dir, metrics["accuracy"], metrics["format_rate"])
    return records, metrics
