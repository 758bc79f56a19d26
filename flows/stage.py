"""What every stage flow shares: the entry point and how a stage finishes."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Sequence
from typing import Any

import mlflow
from prefect import get_run_logger

from rung import config, files, paths, tracking
from rung.config import Params
from rung.errors import InputError
from rung.report import health

Check = Callable[[Params], None]


def preflight(params: Params, checks: Sequence[Check]) -> None:
    """Run a stage's checks (rung.checks) on its params, before any compute."""
    for check in checks:
        check(params)


def main(flow: Callable[..., Any], *args: str, checks: Sequence[Check] = ()) -> None:
    """Entry of `python -m flows.<stage>`: params.yaml is validated, and checked by the stage's own
    `checks` (rung.checks; the pipeline, sweep and study run all of rung.preflight), before any
    compute, and input errors end with one line naming the key, file or field and exit code 2."""
    try:
        preflight(config.load(paths.PARAMS), checks)
        flow(*args)
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    # The process ends next: its objects go with it, not through a last full garbage collection
    # of every loaded library's objects at interpreter shutdown (~1 s on 2 cores). Exit handlers still run.
    gc.freeze()


def finish(stage: str, metrics: dict[str, Any]) -> None:
    """Write the stage's DVC metrics file and log the same numbers to its MLflow run; what the
    numbers show to be degenerate (rung.report.health) is logged as a warning, kept in the metrics file
    under "warnings" (the report lists them) and tagged on the MLflow run."""
    found = health.warnings(stage, metrics)
    for w in found:
        get_run_logger().warning(w)
    files.write_json(paths.metrics(stage), {**metrics, "warnings": found} if found else metrics)
    tracking.log_metrics(metrics, prefix=stage)
    if found:
        mlflow.set_tag("rung.warnings", " | ".join(found)[:5000])
