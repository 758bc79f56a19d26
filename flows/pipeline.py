"""The whole DAG as one Prefect flow: DVC decides what is stale, Prefect runs it with retries.

Gives the same outputs as `dvc repro`, plus one MLflow parent run whose children are the stages
run by this execution. Runs ephemeral, or against a Prefect server when PREFECT_API_URL is set.
"""
from __future__ import annotations

import os

import mlflow
from prefect import flow, get_run_logger

from flows.stage import main
from rung import config, layout, tracking
from tasks import dvc


@flow(name="pipeline")
def pipeline(params_file: str = str(layout.PARAMS)) -> list[str]:
    params = config.load(params_file)
    log = get_run_logger()
    parent = tracking.start_parent(params, name="pipeline").info.run_id
    os.environ[tracking.PARENT_ENV] = parent  # inherited by the stage processes
    ran, status = [], "FAILED"
    try:
        for stage in dvc.stages_in_order():
            if dvc.is_stale(stage):
                dvc.repro(stage)
                ran.append(stage)
            else:
                log.info("%s: up to date", stage)
        status = "FINISHED"
    finally:
        del os.environ[tracking.PARENT_ENV]
        client = mlflow.MlflowClient()
        client.set_tag(parent, "rung.stages_run", ",".join(ran) or "none")
        client.set_terminated(parent, status)
    log.info("ran %d stage(s): %s", len(ran), ", ".join(ran) or "none")
    return ran


if __name__ == "__main__":
    main(pipeline)
