"""What every stage flow shares: the entry point and how a stage finishes."""

from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import mlflow
import psutil
from prefect import get_run_logger

from flows import credentials
from rung import config, files, paths, tracking
from rung.config import Params
from rung.errors import InputError, Unavailable
from rung.report import health, keys, timings
from rung.seeding import derive

Check = Callable[[Params], None]


def preflight(params: Params, checks: Sequence[Check]) -> None:
    """Run a stage's checks (rung.checks) on its params, before any compute."""
    for check in checks:
        check(params)


def main(flow: Callable[..., Any], *args: str, checks: Sequence[Check] = ()) -> None:
    """Entry of `python -m flows.<stage>`: params.yaml is validated, the servers are asked whether they
    accept the credentials (flows.credentials), and the params are checked by the stage's own `checks`
    (rung.checks; the pipeline, sweep and study run all of rung.preflight), before any compute; input
    errors end with one line naming the key, file, field or server and exit code 2, a server that went
    away during the stage with one line and exit code 75 (rung.errors.Unavailable)."""
    status: timings.Status = "failed"
    try:
        params = config.load(paths.PARAMS)
        credentials.check(params)
        preflight(params, checks)
        flow(*args)
        status = "ran"
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except Unavailable as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(Unavailable.exit_code) from None
    finally:
        record_time(status)
    # The process ends next: its objects go with it, not through a last full garbage collection
    # of every loaded library's objects at interpreter shutdown (~1 s on 2 cores). Exit handlers still run.
    gc.freeze()


def record_time(status: timings.Status) -> None:
    """This stage's wall time, from its process's start (imports included) to its flow's end: in
    data/timings/ (under DVC: the table of the run, rung.report.timings, which says why it is in no
    DVC output) and, when it ran to the end, on its MLflow run and parent (a failed stage's server may
    be what failed: no waiting on it). A record: failing to write it neither fails the stage nor hides
    why the stage failed."""
    started = psutil.Process().create_time()
    seconds = time.time() - started
    try:
        if stage := os.environ.get("DVC_STAGE"):  # a flow run outside DVC is no stage of a pipeline run
            timings.record(stage, status, started, seconds, tracking.dvc_process())
        if status == "ran":
            tracking.log_duration(seconds)
    except Exception as e:
        print(f"the stage's wall time ({seconds:.1f} s) was not recorded: {str(e)[:200]}", file=sys.stderr)


def finish(stage: str, metrics: dict[str, Any], tracked: dict[str, float] | None = None) -> None:
    """Write the stage's DVC metrics file and log its numbers to the stage's MLflow run (`tracked`:
    the MLflow metrics, by default every number as `<stage>/<key>`); what the numbers show to be
    degenerate (rung.report.health) is logged as a warning and tagged on the MLflow run. Those are
    records, not DVC outputs (the report recomputes the warnings from the metrics files), so the report
    layer is not a DVC code dep of the stages (tests/imports.py)."""
    found = health.warnings(stage, metrics)
    for w in found:
        get_run_logger().warning(w)
    files.write_json(paths.metrics(stage), metrics)
    tracked = keys.metric_keys(metrics, prefix=stage) if tracked is None else tracked
    run = mlflow.active_run()
    have = mlflow.MlflowClient().get_run(run.info.run_id).data.metrics if run else {}
    mlflow.log_metrics({k: v for k, v in tracked.items() if have.get(k) != v})  # a reopened run has them once
    if found:
        mlflow.set_tag("rung.warnings", " | ".join(found)[:5000])


def dvc_md5(path: Path) -> str:
    """DVC's hash of an output as dvc.lock records it (a directory's: its `.dir` listing's, built by
    dvc_data's Tree from the files' md5s)."""
    from dvc_data.hashfile.hash_info import HashInfo
    from dvc_data.hashfile.meta import Meta
    from dvc_data.hashfile.tree import Tree

    if path.is_file():
        return files.md5(path)
    tree = Tree()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            tree.add(p.relative_to(path).parts, Meta(size=p.stat().st_size), HashInfo("md5", files.md5(p)))
    tree.digest()
    digest = tree.hash_info.value
    assert digest is not None  # digest() sets it
    return digest


def record_checkpoint(params: Params, checkpoint: str, trained: bool = False) -> None:
    """Tag the active run with the checkpoint it produced or evaluated: its name, what it started from,
    its directory and DVC md5 (the `md5` of that out in dvc.lock); a `trained` one also goes in as a
    logged model when tracking.log_models asks for it."""
    model_dir = paths.checkpoint(checkpoint)
    mlflow.set_tags(
        {
            "rung.checkpoint": checkpoint,
            "rung.init": params.init_of(checkpoint),
            "rung.model_dir": model_dir.as_posix(),
            "rung.model_dvc_md5": dvc_md5(model_dir),
        }
    )
    if trained and params.tracking.log_models:
        tracking.log_model(model_dir)


def learned_reward(params: Params, section: str, name: str) -> tuple[Any, str, int]:
    """Learned-reward stage `name` of `section` (reward_models, process_reward_models): its settings, params key and
    seed (its own, or derived from the global one and its name); InputError naming the section for another name."""
    stages = getattr(params, section)
    if name not in stages:
        raise InputError(f"{section}: no stage named {name!r} (have {list(stages)})")
    settings = stages[name]
    return settings, f"{section}.{name}", derive(params.seed if settings.seed is None else settings.seed, section, name)


def learned_reward_tags(model_dir: Path, init: str) -> None:
    """Tag the active run with the learned reward it trained: its directory, DVC md5 and init checkpoint."""
    mlflow.set_tags(
        {"rung.model_dir": model_dir.as_posix(), "rung.model_dvc_md5": dvc_md5(model_dir), "rung.init": init}
    )
