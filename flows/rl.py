"""Stage `rl@<name>`: one GRPO stage on the difficulty-filtered train set."""
from __future__ import annotations

import sys

from prefect import flow

from flows.stage import finish, main
from rung import config, layout, tracking
from rung.errors import InputError
from rung.seeding import derive
from tasks import train


@flow(name="rl")
def rl(stage_name: str, params_file: str = str(layout.PARAMS)) -> None:
    params = config.load(params_file)
    if stage_name not in params.rl.stages:
        raise InputError(f"rl.stages: no stage named {stage_name!r} (have {list(params.rl.stages)})")
    stage = params.rl.stages[stage_name]
    init = layout.checkpoint(stage.init)
    logged = {"seed": params.seed, "rl": {stage_name: stage.model_dump()}, "format": params.format.model_dump()}
    with tracking.stage_run(f"rl@{stage_name}", params, logged, inputs={"model": init, "train": layout.FILTERED}):
        metrics = train.train_rl(
            init, layout.FILTERED, params.format, stage, params.difficulty.buckets, params.model.dtype,
            derive(params.seed, "rl", stage_name), layout.WORK / "rl" / stage_name, layout.checkpoint(f"rl/{stage_name}"), layout.plot("rl", stage_name),
        )
        finish(f"rl-{stage_name}", metrics)


if __name__ == "__main__":
    main(rl, *sys.argv[1:2])
