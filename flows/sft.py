"""Stage `sft`: warm-start the base model on the SFT traces in the response format (or, with
sft.enabled false, pass the base model through for zero-RL)."""
from __future__ import annotations

from prefect import flow

from flows.stage import finish, main
from rung import config, layout, tracking
from rung.seeding import derive
from tasks import train


@flow(name="sft")
def sft(params_file: str = str(layout.PARAMS)) -> None:
    params = config.load(params_file)
    seed = derive(params.seed, "sft")
    # "seed" is the trainer's own (TRL logs it too; MLflow refuses a second value for a param).
    logged = {"global_seed": params.seed, "seed": seed, "sft": params.sft.model_dump(), "format": params.format.model_dump()}
    with tracking.stage_run("sft", params, logged, inputs={"model": layout.BASE, "train": layout.TRACES}):
        if not params.sft.enabled:
            train.copy_base(layout.BASE, layout.SFT)
            finish("sft", {"skipped": 1})
            return
        metrics = train.train_sft(layout.BASE, layout.TRACES, params.format, params.sft, params.model.dtype, seed, layout.WORK / "sft", layout.SFT)
        finish("sft", metrics)


if __name__ == "__main__":
    main(sft)
