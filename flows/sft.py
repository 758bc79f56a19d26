"""Stage `sft`: warm-start the base model on worked solutions in the response format."""
from __future__ import annotations

from prefect import flow

from flows.stage import finish, main
from rung import config, layout, tracking
from rung.seeding import derive
from tasks import train


@flow(name="sft")
def sft(params_file: str = str(layout.PARAMS)) -> None:
    params = config.load(params_file)
    logged = {"seed": params.seed, "sft": params.sft.model_dump(), "format": params.format.model_dump()}
    with tracking.stage_run("sft", params, logged, inputs={"model": layout.BASE, "train": layout.TRAIN}):
        metrics = train.train_sft(layout.BASE, layout.TRAIN, params.format, params.sft, params.model.dtype, derive(params.seed, "sft"), layout.WORK / "sft", layout.SFT)
        finish("sft", metrics)


if __name__ == "__main__":
    main(sft)
