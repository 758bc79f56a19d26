"""Stage `sft`: warm-start the base model on the SFT traces in the response format (or, with
sft.enabled false, pass the base model through for zero-RL)."""

from __future__ import annotations

from prefect import flow

from flows.stage import finish, main, record_checkpoint
from rung import config, models, paths, tracking
from rung.checks.models import chat_template
from rung.checks.training import sft_launch
from rung.seeding import derive
from rung.train import launch
from rung.train.checkpoints import discard
from rung.train.jobs import SFTJob

CHECKS = (chat_template, sft_launch)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="sft")
def sft(params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    seed = derive(params.seed, "sft")
    # "seed" is the trainer's own (TRL logs it too; MLflow refuses a second value for a param).
    logged = {
        "global_seed": params.seed,
        "seed": seed,
        "sft": params.sft.model_dump(),
        "format": params.format.model_dump(),
    }
    with tracking.stage_run("sft", params, logged, inputs={"model": paths.BASE, "train": paths.TRACES}, resumable=True):
        if not params.sft.enabled:
            models.passthrough(paths.BASE, paths.SFT, stage="sft")
            record_checkpoint(params, "sft")
            finish("sft", {"skipped": 1})
            return
        job = SFTJob(
            key="sft",
            params=params.sft,
            init=paths.BASE,
            data=paths.TRACES,
            work_dir=paths.WORK / "sft",
            seed=seed,
            **SFTJob.shared(params),
        )
        metrics = launch.train(job, params.sft.launch, paths.SFT)
        record_checkpoint(params, "sft", trained=True)
        finish("sft", metrics)
        discard(job.work_dir)  # once the records are complete: a rerun for want of MLflow resumes from them


if __name__ == "__main__":
    main(sft, checks=CHECKS)
