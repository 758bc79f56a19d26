"""Stage `rl@<name>`: one GRPO stage on the difficulty-filtered train set."""

from __future__ import annotations

import sys

from prefect import flow

from flows.stage import finish, main, record_checkpoint
from rung import config, paths, tracking
from rung.checks.environments import environments
from rung.checks.models import chat_template
from rung.checks.rl import rl_stages
from rung.errors import InputError
from rung.report import keys
from rung.train import launch
from rung.train.checkpoints import discard
from rung.train.jobs import RLJob

CHECKS = (chat_template, rl_stages, environments)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="rl")
def rl(stage_name: str, params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    if stage_name not in params.rl.stages:
        raise InputError(f"rl.stages: no stage named {stage_name!r} (have {list(params.rl.stages)})")
    stage = params.rl.stages[stage_name]
    job = RLJob.of(params, stage_name)
    # "seed" is the trainer's own (TRL logs it too; MLflow refuses a second value for a param).
    logged = {
        "global_seed": params.seed,
        "seed": job.seed,
        "rl": {stage_name: stage.model_dump()},
        "format": params.format.model_dump(),
    }
    if job.environment:  # logged only with one: a single-turn stage's params stay as they were
        logged["environment"] = job.environment.model_dump()
    inputs = {"model": job.init, "train": job.data}
    with tracking.stage_run(f"rl@{stage_name}", params, logged, inputs=inputs, resumable=True):
        metrics = launch.train(job, stage.launch, paths.checkpoint(f"rl/{stage_name}"))
        record_checkpoint(params, f"rl/{stage_name}", trained=True)
        # One key per quantity: `rl/<metric>` for every RL stage (the stage is the run's rung.checkpoint tag).
        finish(f"rl-{stage_name}", metrics, keys.metric_keys(metrics, prefix="rl"))
        discard(job.work_dir)  # once the records are complete: a rerun for want of MLflow resumes from them


if __name__ == "__main__":
    main(rl, *sys.argv[1:2], checks=CHECKS)
