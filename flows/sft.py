"""Stage `sft`: warm-start the base model on the SFT traces in the response format (or, with
sft.enabled false, pass the base model through for zero-RL)."""
from __future__ import annotations

from prefect import flow

from flows.stage import finish, main
from rung import config, launch, layout, models, tracking
from rung.jobs import SFTJob
from rung.seeding import derive


@flow(name="sft")
def sft(params_file: str = str(layout.PARAMS)) -> None:
    params = config.load(params_file)
    seed = derive(params.seed, "sft")
    # "seed" is the trainer's own (TRL logs it too; MLflow refuses a second value for a param).
    logged = {"global_seed": params.seed, "seed": seed, "sft": params.sft.model_dump(), "format": params.format.model_dump()}
    with tracking.stage_run("sft", params, logged, inputs={"model": layout.BASE, "train": layout.TRACES}):
        if not params.sft.enabled:
            models.passthrough(layout.BASE, layout.SFT, stage="sft")
            finish("sft", {"skipped": 1})
            return
        job = SFTJob(key="sft", params=params.sft, init=layout.BASE, data=layout.TRACES, work_dir=layout.WORK / "sft",
                     format=params.format, seed=seed, dtype=params.model.dtype, device=params.model.device)
        finish("sft", launch.train(job, params.sft.launch, layout.SFT))


if __name__ == "__main__":
    main(sft)
