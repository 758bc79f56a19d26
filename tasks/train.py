from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from rung import io, launch, models
from rung.config import FormatParams, LaunchParams
from rung.trainer import CURRICULUM_STATE, FINAL, resume_point


def _train(kind: str, init: Path, data: Path, fmt: FormatParams, params: Any, launch_params: LaunchParams, extra: dict[str, Any], dtype: str, seed: int, work_dir: Path, out_dir: Path, key: str) -> dict[str, Any]:
    """Train (resuming from the last checkpoint in `work_dir` when it was written for the same
    inputs), publish the model at `out_dir` and clear the checkpoints; returns the job's result."""
    config = {"kind": kind, "params": params.model_dump(mode="json", by_alias=True), "format": fmt.model_dump(), "seed": seed, "dtype": dtype, **extra}
    # An RL checkpoint is complete once the curriculum state is written beside TRL's files.
    complete = ("trainer_state.json", CURRICULUM_STATE) if kind == "rl" else ("trainer_state.json",)
    resume = resume_point(work_dir, {**config, "init": io.md5(init), "data": io.md5(data)}, complete)
    if resume:
        get_run_logger().info("resuming from %s", resume)
    spec = {**config, "init": str(init), "data": str(data), "work_dir": str(work_dir), "resume": resume}
    result = launch.run(spec, launch_params, work_dir, key)
    models.publish(work_dir / FINAL, out_dir, {"stage": kind, "init": str(init), **config})
    shutil.rmtree(work_dir)  # checkpoints are for resuming an interrupted run only
    return result


@task(cache_policy=NO_CACHE)
def train_sft(init: Path, data: Path, fmt: FormatParams, params: Any, dtype: str, seed: int, work_dir: Path, out_dir: Path) -> dict[str, float]:
    """SFT from `init` on the traces in `data`; the model lands at `out_dir`; returns summary metrics."""
    return _train("sft", init, data, fmt, params, params.launch, {}, dtype, seed, work_dir, out_dir, "sft.launch")["metrics"]


@task(cache_policy=NO_CACHE)
def train_rl(init: Path, data: Path, fmt: FormatParams, stage: Any, name: str, buckets: dict[str, float], dtype: str, seed: int, work_dir: Path, out_dir: Path, curves_path: Path) -> dict[str, float]:
    """One RL stage from `init` on the prompts in `data`; the model lands at `out_dir`, per-step
    curves at `curves_path`; returns summary metrics."""
    result = _train("rl", init, data, fmt, stage, stage.launch, {"buckets": buckets}, dtype, seed, work_dir, out_dir, f"rl.stages.{name}.launch")
    io.write_json(curves_path, result["curves"])
    return result["metrics"]


@task(cache_policy=NO_CACHE)
def copy_base(init: Path, out_dir: Path) -> None:
    """Zero-RL: the sft checkpoint is the base model unchanged."""
    with io.atomic_path(out_dir) as tmp:
        shutil.copytree(init, tmp)
        models.write_provenance(tmp, {"stage": "sft", "skipped": True, "init": str(init)})
