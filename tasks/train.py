from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rung import io, models, rl, sft
from rung.config import FormatParams, RLStageParams, SFTParams
from rung.trainer import resume_point


def _resume(work_dir: Path, fingerprint: dict[str, Any]) -> str | None:
    point = resume_point(work_dir, fingerprint)
    if point:
        get_run_logger().info("resuming from %s", point)
    return point


@task(cache_policy=NO_CACHE)
def train_sft(init: Path, data: Path, fmt: FormatParams, params: SFTParams, dtype: str, seed: int, work_dir: Path, out_dir: Path) -> dict[str, float]:
    """SFT from `init` on the rows in `data`, resuming like train_rl; the model lands at `out_dir`;
    returns summary metrics."""
    config = {"sft": params.model_dump(mode="json"), "format": fmt.model_dump(), "seed": seed, "dtype": dtype}
    resume = _resume(work_dir, {**config, "init": io.md5(init), "data": io.md5(data)})
    model, tok, metrics = sft.train(init, io.read_jsonl(data), fmt, params, seed, work_dir, dtype, resume)
    models.save(model, tok, out_dir, {"stage": "sft", "init": str(init), **config})
    return metrics


@task(cache_policy=NO_CACHE)
def train_rl(init: Path, data: Path, fmt: FormatParams, stage: RLStageParams, buckets: dict[str, float], dtype: str, seed: int, work_dir: Path, out_dir: Path, curves_path: Path) -> dict[str, float]:
    """One RL stage from `init` on the prompts in `data`, resuming from the last checkpoint in
    `work_dir` when it was written for the same inputs; the model lands at `out_dir`, per-step
    curves at `curves_path`; returns summary metrics."""
    config = {"stage": stage.model_dump(mode="json"), "buckets": buckets, "format": fmt.model_dump(), "seed": seed, "dtype": dtype}
    resume = _resume(work_dir, {**config, "init": io.md5(init), "data": io.md5(data)})
    model, tok, metrics, curves = rl.train(init, io.read_jsonl(data), fmt, stage, buckets, seed, work_dir, dtype, resume)
    io.write_json(curves_path, curves)
    models.save(model, tok, out_dir, {"stage": "rl", "init": str(init), **config})
    return metrics
