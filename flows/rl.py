"""Stage `rl@<name>`: one GRPO stage on the difficulty-filtered train set."""
from __future__ import annotations

import sys

from prefect import flow

from flows.stage import finish, main
from rung import config, layout, tracking
from rung.errors import InputError
from rung.generation import require_vllm
from rung.seeding import derive
from tasks import train


@flow(name="rl")
def rl(stage_name: str, params_file: str = str(layout.PARAMS)) -> None:
    params = config.load(params_file)
    if stage_name not in params.rl.stages:
        raise InputError(f"rl.stages: no stage named {stage_name!r} (have {list(params.rl.stages)})")
    stage = params.rl.stages[stage_name]
    init = layout.checkpoint(stage.init)
    if stage.use_vllm:
        require_vllm(f"rl.stages.{stage_name}.use_vllm")
    seed = derive(params.seed, "rl", stage_name)
    # "seed" is the trainer's own (TRL logs it too; MLflow refuses a second value for a param).
    logged = {"global_seed": params.seed, "seed": seed, "rl": {stage_name: stage.model_dump()}, "format": params.format.model_dump()}
    with tracking.stage_run(f"rl@{stage_name}", params, logged, inputs={"model": init, "train": layout.FILTERED}):
        metrics = train.train_rl(
            init, layout.FILTERED, params.format, stage, stage_name, params.difficulty.buckets, params.model.dtype,
            seed, layout.WORK / "rl" / stage_name, layout.checkpoint(f"rl/{stage_name}"), layout.plot("rl", stage_name),
        )
        finish(f"rl-{stage_name}", metrics)


if __name__ == "__main__":
    main(rl, *sys.argv[1:2])
