"""Stage `model`: materialize the base model as an HF directory at data/models/base."""

from __future__ import annotations

from prefect import flow

from flows.stage import finish, main, record_checkpoint
from rung import config, paths, tracking
from rung.checks.models import base_model
from tasks import model as model_tasks

CHECKS = (base_model,)
"""What this stage checks of params before any compute (flows.stage.main)."""


@flow(name="model")
def model(params_file: str = str(paths.PARAMS)) -> None:
    params = config.load(params_file)
    with tracking.stage_run("model", params, logged={"model": params.model.model_dump()}, inputs={}):
        parameters = model_tasks.materialize(params.model, paths.BASE)
        record_checkpoint(params, "base")
        finish("model", {"parameters": parameters})


if __name__ == "__main__":
    main(model, checks=CHECKS)
