"""The whole DAG as one Prefect flow: DVC decides what is stale, Prefect runs it with retries.

Gives the same outputs as `dvc repro`, plus the experiment's MLflow parent run (the latest of the
same commit and params, else a new one) whose children are the stages run, and a table of every
stage's headline metrics (Prefect artifact `rung-stages`, MLflow artifact `stages.md` of the
parent run). Runs ephemeral, or against a Prefect server when PREFECT_API_URL is set; with a
server, one pipeline per workspace at a time.
"""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import mlflow
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from flows.stage import main
from rung import config, paths, preflight, tracking
from rung.errors import InputError
from rung.report import timings
from tasks import dvc

# Headline keys of each metrics file (data/metrics/<stem>.json), in pipeline order.
HEADLINES = {
    "model": ["parameters"],
    "curate": ["train", "test"],
    "difficulty": ["kept", "mean_pass_rate"],
    "sft": ["train_loss"],
    "rl-*": ["reward_last", "train_loss"],
    "eval-*": ["sets.test.accuracy", "sets.test.format_rate"],
}

CHECKS = (preflight.check,)
"""What this stage checks of params before any compute (flows.stage.main)."""


def stage_summary(metrics_dir: Path = paths.METRICS) -> str:
    """A markdown table with the headline metrics of every stage's metrics file."""
    rows = []
    for path in metrics_dir.glob("*.json"):
        rank, keys = next(
            ((i, k) for i, (pat, k) in enumerate(HEADLINES.items()) if fnmatch.fnmatch(path.stem, pat)),
            (len(HEADLINES), []),
        )
        metrics = json.loads(path.read_text())
        if not isinstance(metrics, dict):
            continue
        for key in keys or [k for k, v in metrics.items() if isinstance(v, (int, float))][:3]:
            value: Any = metrics
            for part in key.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            if value is not None:
                rows.append((rank, path.stem, key, f"{value:.4g}" if isinstance(value, float) else str(value)))
    lines = [
        "| stage | metric | value |",
        "|---|---|---|",
        *(f"| {s} | {k} | {v} |" for _, s, k, v in sorted(rows, key=lambda r: r[:2])),
    ]
    return "\n".join(["# rung stages", "", *lines, ""])


@flow(name="pipeline")
def pipeline(params_file: str = str(paths.PARAMS)) -> list[str]:
    params = config.load(params_file)
    log = get_run_logger()
    with dvc.workspace_lock():
        timings.begin()  # the stages below are this run's (a deployment's run has no flows.with_server around it)
        parent = tracking.parent_for(params, invocation="pipeline", params_file=Path(params_file))
        os.environ[tracking.PARENT_ENV] = parent  # inherited by the stage processes
        ran, status, order = [], "FAILED", dvc.stages_in_order()
        try:
            for stage in order:
                if dvc.is_stale(stage):
                    try:
                        dvc.repro(stage)
                    except subprocess.CalledProcessError as e:
                        if e.returncode == dvc.INPUT_ERROR:
                            raise InputError(f"stage {stage} rejected its input (its error is above)") from None
                        raise
                    ran.append(stage)
                else:
                    log.info("%s: up to date", stage)
            status = "FINISHED"
        finally:
            del os.environ[tracking.PARENT_ENV]
            client = mlflow.MlflowClient()
            client.set_tag(parent, "rung.stages_run", ",".join(ran) or "none")
            client.set_terminated(parent, status)
    summary = stage_summary() + "\n" + timings.markdown(order)
    create_markdown_artifact(
        markdown=summary, key="rung-stages", description="headline metrics and wall time of every stage"
    )
    mlflow.MlflowClient().log_text(parent, summary, "stages.md")
    log.info("ran %d stage(s): %s", len(ran), ", ".join(ran) or "none")
    return ran


if __name__ == "__main__":
    main(pipeline, checks=CHECKS)
