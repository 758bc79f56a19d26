"""MLflow: one parent run per experiment (a commit, its params and DVC experiment name), one child
run per stage.

The parent carries the flattened params, the tags that name the experiment and (logged by the
report stage) its headline metrics, so two experiments compare on one row each. A stage finds it
through RUNG_PIPELINE_RUN_ID (set by `python -m flows.pipeline`), else, under a plain `dvc repro`,
through a tag keyed on the invoking dvc process (the stages of one `dvc repro` share a parent),
else it is the latest parent of the same commit, params, workspace and DVC experiment (a stage run
alone, a rerun); failing that, a new parent starts and the stage says why on stderr. A training
stage's rerun also reopens the stage run of its unfinished attempt (stage_run(resumable=True)).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mlflow
import psutil
import yaml
from mlflow.entities import Metric, Param, Run

from rung.config import Params
from rung.files import flatten, md5
from rung.report.keys import STAGE_DURATION, metric_keys, stage_duration

PARENT_ENV = "RUNG_PIPELINE_RUN_ID"
PARAMS_MD5_TAG = "rung.params_md5"
# MLflow 3's UI opens an experiment by its kind; without one it shows the GenAI overview (traces).
# "finetuning" is one of the kinds it opens on the training runs (mlflow/server/js: ExperimentKind).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "finetuning"
VERSIONED = (
    "torch",
    "transformers",
    "trl",
    "datasets",
    "accelerate",
    "reasoning-gym",
    "math-verify",
    "vllm",
    "prefect",
    "dvc",
    "mlflow",
)


def repo_root() -> Path:
    """The DVC workspace the stage runs in (DVC sets DVC_ROOT for stage commands)."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def tracking_uri(params: Params) -> str:
    """MLFLOW_TRACKING_URI, else params.tracking.uri, else sqlite at <repo>/mlflow.db (absolute,
    so that DVC temp workspaces and Prefect workers share one store)."""
    return os.environ.get("MLFLOW_TRACKING_URI") or params.tracking.uri or f"sqlite:///{repo_root() / 'mlflow.db'}"


def setup(params: Params) -> str:
    """Point MLflow at the store and experiment of `params`, marked as a training experiment
    (unless its kind was set otherwise); returns the experiment id."""
    mlflow.set_tracking_uri(tracking_uri(params))
    experiment = mlflow.set_experiment(params.tracking.experiment)
    if EXPERIMENT_KIND_TAG not in experiment.tags:
        mlflow.MlflowClient().set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return experiment.experiment_id


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"


def changed_params(path: Path | str = "params.yaml", limit: int = 3) -> str:
    """The params that differ from the committed params.yaml, as 'key=value, ...' (at most `limit`,
    then '+N more'); '' when none differ or git cannot tell."""
    try:
        committed = subprocess.run(
            ["git", "show", f"HEAD:{Path(path).as_posix()}"], capture_output=True, text=True, check=True
        ).stdout
        old, new = flatten(yaml.safe_load(committed) or {}), flatten(yaml.safe_load(Path(path).read_text()) or {})
    except (subprocess.CalledProcessError, FileNotFoundError, OSError, yaml.YAMLError):
        return ""
    diff = [f"{k}={new.get(k, '(removed)')}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    more = f", +{len(diff) - limit} more" if len(diff) > limit else ""
    return ", ".join(diff[:limit]) + more


def parent_name(invocation: str) -> str:
    """What a parent run ran, for the runs list: the DVC experiment's name when there is one, else
    '<invocation> <short commit>' and the params changed since that commit, e.g.
    'repro 1a2b3c4 (rl.stages.main.learning_rate=1e-05)'."""
    if os.environ.get("DVC_EXP_NAME"):
        return os.environ["DVC_EXP_NAME"]
    commit = git_commit()
    name = f"{invocation} {commit[:7]}" if commit != "unknown" else invocation
    changed = changed_params()
    return f"{name} ({changed})" if changed else name


def versions() -> dict[str, str]:
    """Resolved versions of the packages that decide results, as MLflow tags."""
    out = {}
    for name in VERSIONED:
        try:
            out[f"version.{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


OWNER_TAG = "rung.owner"  # '<host>:<pid>-<start time>' of the process that closes the run
WORKSPACE_TAG = "rung.workspace"  # '<host>:<repo root>' of a parent run: another workspace gets a parent of its own


def workspace() -> str:
    return f"{socket.gethostname()}:{repo_root()}"


def _owner(proc: psutil.Process | None = None) -> str:
    proc = proc or psutil.Process()
    return f"{socket.gethostname()}:{proc.pid}-{proc.create_time():.0f}"


def close_orphans(experiment_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs whose owner process, on this host, is gone (a killed stage or
    `dvc repro`): a resumed stage then starts a new run and no run stays RUNNING for ever."""
    host = socket.gethostname()
    client = mlflow.MlflowClient()
    closed = []
    for run in client.search_runs([experiment_id], filter_string="attributes.status = 'RUNNING'", max_results=1000):
        owner = run.data.tags.get(OWNER_TAG, "")
        where, _, ident = owner.rpartition(":")
        if where != host or not ident:
            continue
        pid, _, started = ident.partition("-")
        try:
            alive = f"{psutil.Process(int(pid)).create_time():.0f}" == started
        except psutil.Error:
            alive = False
        if not alive:
            client.set_terminated(run.info.run_id, "KILLED")
            closed.append(run.info.run_id)
    return closed


def dvc_process() -> psutil.Process | None:
    """The `dvc` process running this stage, if any."""
    try:
        for proc in psutil.Process().parents():
            cmd = proc.cmdline()
            if any(Path(a).name == "dvc" for a in cmd[:2]) or cmd[1:3] == ["-m", "dvc"]:
                return proc
    except psutil.Error:
        return None
    return None


def _dvc_invocation() -> str | None:
    """'<host>:<pid>-<start time>' of the `dvc` process running this stage, if any."""
    proc = dvc_process()
    return _owner(proc) if proc else None


def params_md5(params: Params) -> str:
    """md5 of the resolved params (defaults filled in, so formatting and spelt-out defaults do not count)."""
    return hashlib.md5(json.dumps(params.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()


def recipe(params_file: Path) -> str | None:
    """The recipe a `rung run` workspace was made from: flows.run writes `# rung run <recipe> ...` as
    the first line of its params.yaml."""
    try:
        first = params_file.read_text().partition("\n")[0]
    except OSError:
        return None
    found = re.match(r"# rung run (\S+)", first)
    return Path(found.group(1)).stem if found else None


def flat_params(params: Params) -> dict[str, str]:
    """Every resolved param as `<dotted key>: value`, lists as JSON, cut to MLflow's 6000 characters."""
    return {
        k: (json.dumps(v) if isinstance(v, list) else str(v))[:6000]
        for k, v in flatten(params.model_dump(mode="json")).items()
    }


def start_parent(
    params: Params, invocation: str = "pipeline", key: str | None = None, params_file: Path | None = None
) -> Run:
    """Start (and leave open) the parent run of an experiment, named by parent_name: the flattened
    params as params, params.yaml as an artifact, and the tags that name it (commit, DVC experiment,
    recipe, seed, params md5)."""
    experiment_id = setup(params)
    close_orphans(experiment_id)
    params_file = params_file or repo_root() / "params.yaml"
    tags = {
        "rung.role": "pipeline",
        "rung.invocation": invocation,
        "git.commit": git_commit(),
        "rung.seed": str(params.seed),
        PARAMS_MD5_TAG: params_md5(params),
        WORKSPACE_TAG: workspace(),
        OWNER_TAG: key or _owner(),
        **versions(),
    }
    if key:
        tags["rung.pipeline_key"] = key
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    if name := recipe(params_file):
        tags["rung.recipe"] = name
    client = mlflow.MlflowClient()
    run = client.create_run(experiment_id, run_name=parent_name(invocation), tags=tags)
    client.log_batch(run.info.run_id, params=[Param(k, v) for k, v in flat_params(params).items()])
    if params_file.is_file():
        client.log_artifact(run.info.run_id, str(params_file))
    return run


def latest_parent(params: Params) -> tuple[Run | None, str]:
    """The latest parent run of the same commit, params, workspace and DVC experiment name, or None and
    why none (two workspaces of one commit and params, run by two workers at once, get a parent each)."""
    commit = git_commit()
    if commit == "unknown":
        return None, "not in a git repository, so no earlier parent run is known to be of the same code"
    found = mlflow.search_runs(
        experiment_names=[params.tracking.experiment],
        filter_string=(
            f"tags.`rung.role` = 'pipeline' and tags.`git.commit` = '{commit}' "
            f"and tags.`{PARAMS_MD5_TAG}` = '{params_md5(params)}' and tags.`{WORKSPACE_TAG}` = '{workspace()}'"
        ),
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    exp = os.environ.get("DVC_EXP_NAME")
    same = [r for r in found if r.data.tags.get("dvc.exp_name") == exp]
    if same:
        return same[0], ""
    return None, f"no parent run of commit {commit[:7]} with these params in this workspace" + (
        f" in DVC experiment {exp}" if exp else ""
    )


def parent_for(params: Params, invocation: str, key: str | None = None, params_file: Path | None = None) -> str:
    """The id of this experiment's parent run, reopened as RUNNING for this process: the latest of the
    same commit, params and DVC experiment, else a new one; says on stderr which, and why not reused."""
    setup(params)
    earlier, why = latest_parent(params)
    if earlier is None:
        run = start_parent(params, invocation, key, params_file)
        print(f"MLflow: new parent run '{run.info.run_name}' ({why})", file=sys.stderr)
        return run.info.run_id
    client = mlflow.MlflowClient()
    run_id = earlier.info.run_id
    client.update_run(run_id, status="RUNNING")
    client.set_tag(run_id, OWNER_TAG, key or _owner())
    if key:
        client.set_tag(run_id, "rung.pipeline_key", key)
    print(f"MLflow: adding to parent run '{earlier.info.run_name}' (same commit and params)", file=sys.stderr)
    return run_id


def _parent_id(params: Params) -> str:
    if os.environ.get(PARENT_ENV):
        return os.environ[PARENT_ENV]
    key = _dvc_invocation()
    if key:
        found = mlflow.search_runs(
            experiment_names=[params.tracking.experiment],
            filter_string=f"tags.`rung.pipeline_key` = '{key}'",
            output_format="list",
            max_results=1,
        )
        if found:
            return found[0].info.run_id
    return parent_for(params, invocation="repro" if key else "stage", key=key)


ATTEMPT_TAG = "rung.attempt"  # md5 of a stage run's stage, params and inputs: what a rerun reopens


def _earlier_attempt(experiment_id: str, parent: str, attempt: str) -> str | None:
    """The latest stage run under `parent` of the same stage, params and inputs that did not finish."""
    found = mlflow.search_runs(
        experiment_ids=[experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent}' and tags.`{ATTEMPT_TAG}` = '{attempt}'",
        order_by=["attributes.start_time DESC"],
        output_format="list",
    )
    unfinished = [r for r in found if r.info.status in ("FAILED", "KILLED")]
    return unfinished[0].info.run_id if unfinished else None


@contextlib.contextmanager
def stage_run(
    stage: str, params: Params, logged: dict[str, Any], inputs: dict[str, Path], resumable: bool = False
) -> Iterator[Run]:
    """A child run for `stage` under the pipeline's parent, with params, tags and input md5s. A
    `resumable` stage (training, which resumes from its checkpoints) reopens the run of its last
    unfinished attempt with the same params and inputs, so that the rerun completes that run's record."""
    experiment_id = setup(params)
    close_orphans(experiment_id)
    parent = _parent_id(params)
    flat = {k: str(v)[:6000] for k, v in flatten(logged).items()}
    md5s = {f"md5.{k}": md5(p) for k, p in inputs.items() if Path(p).exists()}
    tags = {
        OWNER_TAG: _owner(),
        "rung.role": "stage",
        "dvc.stage": os.environ.get("DVC_STAGE", stage),
        "git.commit": git_commit(),
        ATTEMPT_TAG: hashlib.md5(json.dumps([stage, flat, md5s], sort_keys=True).encode()).hexdigest(),
        **versions(),
        **md5s,
    }
    if os.environ.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = os.environ["DVC_EXP_NAME"]
    earlier = _earlier_attempt(experiment_id, parent, tags[ATTEMPT_TAG]) if resumable else None
    run = mlflow.start_run(run_id=earlier, run_name=stage, parent_run_id=None if earlier else parent, tags=tags)
    status = "FAILED"
    try:
        if earlier:
            print(f"MLflow: reopening the stage run of the unfinished attempt {earlier}", file=sys.stderr)
        mlflow.log_params(flat)
        yield run
        mlflow.flush_async_logging()
        status = "FINISHED"
    finally:
        _end(parent, status)


def _end(parent: str, status: str) -> None:
    """End the active stage run and, under plain `dvc repro`, its parent. A failing stage may be failing
    because the server went away: then what cannot be marked is said in one line (the next stage
    start marks the runs of a process that is gone KILLED) and the stage's own error is what it reports."""
    try:
        mlflow.end_run(status)
        if not os.environ.get(PARENT_ENV):
            # Under plain `dvc repro` no process outlives the stages: each closes the parent, and
            # the next stage of the same invocation adds its child run to it all the same.
            mlflow.MlflowClient().set_terminated(parent, status)
    except Exception as e:
        if status == "FINISHED":
            raise
        print(f"MLflow: could not mark the runs {status} ({str(e)[:200]})", file=sys.stderr)


def log_duration(seconds: float) -> None:
    """Log a stage's wall time on the stage run this process ran (`stage/duration_s`) and on its parent
    (`duration_s/<DVC stage>`: the experiment's time per stage); nothing when this process ran none."""
    run = mlflow.last_active_run()  # the stage run, ended by now
    if run is None or run.data.tags.get("rung.role") != "stage":
        return
    client = mlflow.MlflowClient()
    client.log_metric(run.info.run_id, STAGE_DURATION, seconds)
    if parent := run.data.tags.get("mlflow.parentRunId"):
        client.log_metric(parent, stage_duration(run.data.tags["dvc.stage"]), seconds)


def tag_placement(device: str, dtype: str) -> None:
    """Tag the active run with where its model ran (params `model.device` / `model.dtype` resolved)."""
    mlflow.set_tags({"rung.device": device, "rung.dtype": dtype})


VIEW = "rung"
"""The MLflow UI's shared view of the runs table with the headline columns:
<MLflow UI>/#/experiments/<id>/runs?viewStateShareKey=rung."""


def log_headlines(parent_id: str, headlines: dict[str, float], most_params: int = 12) -> None:
    """Log the headline metrics on the parent run, and save the runs table's shared view `VIEW`:
    those metrics and the params that differ between the experiment's parent runs as columns."""
    client = mlflow.MlflowClient()
    now = int(time.time() * 1000)
    client.log_batch(parent_id, metrics=[Metric(k, v, now, 0) for k, v in headlines.items()])
    experiment_id = client.get_run(parent_id).info.experiment_id
    found = client.search_runs([experiment_id], filter_string="tags.`rung.role` = 'pipeline'", max_results=1000)
    parents = [r for r in found if r.data.params]  # parents logged before rung logged params on them have none
    keys = sorted({k for r in parents for k in r.data.params})
    differ = [k for k in keys if len({r.data.params.get(k) for r in parents}) > 1][:most_params]
    # The state MLflow's "Share" button saves in an experiment tag (the UI reads it compressed or, as
    # here, plain JSON); column ids are MLflow's canonical keys, <type>.`<name>`.
    columns = [f"metrics.`{k}`" for k in headlines] + [f"params.`{k}`" for k in differ]
    client.set_experiment_tag(experiment_id, f"mlflow.sharedViewState.{VIEW}", json.dumps({"selectedColumns": columns}))


def log_metrics(metrics: dict[str, Any], prefix: str, step: int | None = None) -> None:
    """Log the numeric leaves of a (nested) metrics dict as `<prefix>/<key>`."""
    mlflow.log_metrics(metric_keys(metrics, prefix), step=step)


def log_tables(run_id: str, tables: dict[str, tuple[list[str], list[list[str]]]]) -> None:
    """Log (header, rows) tables as MLflow table artifacts of run `run_id` (shown as tables in the UI)."""
    client = mlflow.MlflowClient()
    for artifact_file, (header, rows) in tables.items():
        if rows:
            client.log_table(run_id, {h: [r[i] for r in rows] for i, h in enumerate(header)}, artifact_file)


def log_dataset(path: Path, name: str, context: str) -> None:
    """Record a jsonl split as an MLflow dataset input; its digest is the file's md5 (as in dvc.lock)."""
    import pandas as pd  # only here: reading the split as a frame is all MLflow's dataset API needs
    from mlflow.data.pandas_dataset import from_pandas

    frame = pd.read_json(path, lines=True, dtype=False)
    dataset = from_pandas(frame, source=str(path), name=name, digest=md5(path))
    mlflow.log_input(dataset, context=context)


def log_model(model_dir: Path) -> str:
    """Log a checkpoint directory as a transformers-flavour logged model of the active run (name
    'checkpoint', task text-generation); returns its model id."""
    import transformers  # only here: loading the weights is this function's whole cost

    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    # Components, not the checkpoint path: MLflow 3.17's path-based logging fails under transformers 5
    # (it reads the pipeline class's __name__ from a lazily registered string).
    info = mlflow.transformers.log_model(
        {"model": model, "tokenizer": tokenizer},
        name="checkpoint",
        task="text-generation",
        pip_requirements=[f"{p}=={importlib.metadata.version(p)}" for p in ("torch", "transformers")],
    )
    return info.model_id
