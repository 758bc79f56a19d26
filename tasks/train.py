from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE

from rung import io, models, rl, sft
from rung.config import FormatParams, RLStageParams, SFTParams


@task(cache_policy=NO_CACHE)
def train_sft(init: Path, rows: list[dict[str, Any]], fmt: FormatParams, params: SFTParams, dtype: str, seed: int, work_dir: Path, out_dir: Path) -> dict[str, float]:
    """SFT from `init`; the model lands at `out_dir`; returns summary metrics."""
    model, tok, metrics = sft.train(init, rows, fmt, params, seed, work_dir, dtype)
    models.save(model, tok, out_dir, {"stage": "sft", "init": str(init), "seed": seed, "sft": params.model_dump(), "format": fmt.model_dump()})
    return metrics


@task(cache_policy=NO_CACHE)
def train_rl(init: Path, rows: list[dict[str, Any]], fmt: FormatParams, stage: RLStageParams, dtype: str, seed: int, work_dir: Path, out_dir: Path, curves_path: Path) -> dict[str, float]:
    """One GRPO stage from `init`; the model lands at `out_dir`, per-step curves at `curves_path`;
    returns summary metrics."""
    model, tok, metrics, curves = rl.train(init, rows, fmt, stage, seed, work_dir, dtype)
    io.write_json(curves_path, curves)
    models.save(model, tok, out_dir, {"stage": "rl", "init": str(init), "seed": seed, "rl": stage.model_dump(), "format": fmt.model_dump()})
    return metrics
