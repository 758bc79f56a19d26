"""Orchestration end to end, on a tiny model in a temporary git + DVC repo (stages model and
curate only, to stay fast), against a real Prefect server and a real MLflow server on loopback:
prefect.yaml deployed to a process pool `gpu` and run by a worker, the workspace lock, retries
that skip input errors, and a sweep of DVC experiments (flows/sweep.py, `rung sweep`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.concurrency.sync import concurrency
from prefect.settings import PREFECT_API_URL, temporary_settings

from flows import sweep
from rung.errors import InputError
from tasks import dvc
from tests.conftest import free_port, serve, wait_healthy
from tests.test_pipeline import tiny_params
from tests.workspace import make_workspace

STAGES = ["model", "curate"]


def test_accelerate_configs_parse():
    """The four launch configs are valid accelerate files (running them needs GPUs: not tested here)."""
    from accelerate.commands.config.config_args import load_config_from_file

    from rung.train.launch import CONFIGS

    kinds = {name: load_config_from_file(str(CONFIGS / f"{name}.yaml")) for name in ("ddp", "fsdp", "zero2", "zero3")}
    assert {n: c.distributed_type.value for n, c in kinds.items()} == {
        "ddp": "MULTI_GPU",
        "fsdp": "FSDP",
        "zero2": "DEEPSPEED",
        "zero3": "DEEPSPEED",
    }
    assert kinds["fsdp"].fsdp_config["fsdp_version"] == 2
    assert [kinds[n].deepspeed_config["zero_stage"] for n in ("zero2", "zero3")] == [2, 3]
    assert all(c.num_machines == 1 and c.mixed_precision == "bf16" for c in kinds.values())


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """A Prefect server and an MLflow tracking server (sqlite + proxied artifacts), started together."""
    tmp = tmp_path_factory.mktemp("servers")
    prefect_port, mlflow_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    env.update(
        PREFECT_HOME=str(tmp / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        # A waiting holder of a concurrency slot retries after at most this many seconds (default 30).
        PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS="1",
    )
    prefect = serve(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(prefect_port)],
        env,
        tmp / "prefect.log",
    )
    mlflow_server = serve(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(mlflow_port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{tmp / 'm.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            str(tmp / "art"),
        ],
        env,
        tmp / "mlflow.log",
    )
    try:
        wait_healthy(prefect, f"http://127.0.0.1:{prefect_port}/api/health", tmp / "prefect.log")
        wait_healthy(mlflow_server, f"http://127.0.0.1:{mlflow_port}/health", tmp / "mlflow.log")
        yield {
            "prefect": {
                "PREFECT_API_URL": f"http://127.0.0.1:{prefect_port}/api",
                "PREFECT_HOME": str(tmp / "prefect"),
            },
            "mlflow": f"http://127.0.0.1:{mlflow_port}",
            "artifacts": tmp / "art",
        }
    finally:
        for proc in (prefect, mlflow_server):
            proc.terminate()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model, servers):
    ws = tmp_path_factory.mktemp("ws").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    return ws, make_workspace(ws, tiny_params(tiny_model), {**env, **servers["prefect"]}, stages=STAGES)


@pytest.fixture
def prefect_client(servers):
    with (
        temporary_settings({PREFECT_API_URL: servers["prefect"]["PREFECT_API_URL"]}),
        get_client(sync_client=True) as client,
    ):
        yield client


def test_deployed_pipeline_runs_on_a_gpu_pool_worker(workspace, servers, prefect_client, tmp_path):
    ws, run = workspace
    res = run(sys.executable, "-m", "prefect", "work-pool", "create", "gpu", "--type", "process")
    assert res.returncode == 0, res.stdout + res.stderr
    res = run(sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all")  # reads ws/prefect.yaml
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    client = prefect_client
    deployment = client.read_deployment_by_name("pipeline/pipeline")
    assert deployment.work_pool_name == "gpu" and deployment.entrypoint == "flows/pipeline.py:pipeline"
    assert [(s.schedule.cron, s.active) for s in deployment.schedules] == [("0 2 * * *", False)]
    assert client.read_deployment_by_name("sweep/sweep").parameters["jobs"] == 1
    flow_run = client.create_flow_run_from_deployment(deployment.id)

    # A worker elsewhere (cwd), without the venv on PATH: the pull step and tasks.dvc.env() must do.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    env.update(servers["prefect"], RUNG_REPO=str(ws), MLFLOW_TRACKING_URI=servers["mlflow"])
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != Path(sys.executable).parent)
    start = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "gpu", "--run-once", "--limit", "1"]
    worker = subprocess.run(start, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert worker.returncode == 0, worker.stdout[-3000:] + worker.stderr[-3000:]

    state = client.read_flow_run(flow_run.id).state
    assert state.is_completed(), (state, worker.stdout[-3000:] + worker.stderr[-3000:])
    for path in [
        "data/models/base/model.safetensors",
        "data/curated/train.jsonl",
        "data/metrics/model.json",
        "data/metrics/curate.json",
    ]:
        assert (ws / path).is_file(), path
    assert (
        not (tmp_path / "data").exists() and not (ws / "mlflow.db").exists()
    )  # worked in RUNG_REPO, logged to the server

    # The workspace lock: a limit of 1 named after the workspace, taken during the run, released after.
    limit = client.read_global_concurrency_limit_by_name(dvc.lock_name(ws))
    assert limit.limit == 1 and limit.active_slots == 0
    logs = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))]
    assert f"workspace lock {dvc.lock_name(ws)} taken" in logs
    summary = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["rung-stages"])))
    curated = json.loads((ws / "data/metrics/curate.json").read_text())
    assert (
        len(summary) == 1
        and f"| curate | train | {curated['train']} |" in summary[0].data
        and "| model | parameters |" in summary[0].data
    )

    # MLflow server mode: the parent run, a child per stage with params and dataset inputs, proxied artifacts.
    mlflow.set_tracking_uri(servers["mlflow"])
    runs = mlflow.search_runs(experiment_names=["rung"], output_format="list")
    parent = [r for r in runs if r.data.tags.get("rung.invocation") == "pipeline"]
    assert (
        len(parent) == 1
        and parent[0].info.run_name.startswith("pipeline ")
        and parent[0].info.status == "FINISHED"
        and parent[0].data.tags["rung.stages_run"] == "model,curate"
    )
    children = {r.info.run_name: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id}
    assert set(children) == {"model", "curate"}
    assert (
        children["curate"].data.params["seed"] == "42"
        and children["curate"].data.metrics["curate/train"] == curated["train"]
    )
    assert (
        children["curate"].inputs.dataset_inputs[0].dataset.digest
        == run("md5sum", "data/curated/train.jsonl").stdout.split()[0]
    )
    client_ml = mlflow.MlflowClient()
    assert [a.path for a in client_ml.list_artifacts(parent[0].info.run_id)] == ["params.yaml", "stages.md"]
    assert parent[0].data.params["curate.max_test"] == "8" and parent[0].data.tags["rung.seed"] == "42"
    local = client_ml.download_artifacts(parent[0].info.run_id, "stages.md", str(tmp_path))
    assert Path(local).read_text() == summary[0].data
    assert parent[0].info.artifact_uri.startswith("mlflow-artifacts:/") and list(
        servers["artifacts"].rglob("stages.md")
    )


def test_workspace_lock_serializes_runs_and_input_errors_are_not_retried(workspace, prefect_client, tmp_path):
    ws, run = workspace
    assert dvc.repro.retries == 2 and dvc.repro.retry_delay_seconds == [30, 60]  # exponential backoff
    good = (ws / "params.yaml").read_text()
    params = yaml.safe_load(good)
    # passes the preflight, but curate rejects it when it runs (every row filtered out): exit 2
    params["curate"]["filters"].update(min_chars=100000, max_chars=200000)
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    name = dvc.lock_name(ws)
    prefect_client.upsert_global_concurrency_limit_by_name(name, limit=1)
    out = tmp_path / "pipeline.out"
    try:
        with concurrency(name, occupy=1, strict=True):  # another holder of this workspace
            with out.open("w") as f:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "flows.pipeline"],
                    cwd=ws,
                    env=run.env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            deadline = time.time() + 120
            while "waiting for workspace lock" not in out.read_text():
                assert proc.poll() is None and time.time() < deadline, out.read_text()[-3000:]
                time.sleep(0.5)
            time.sleep(3)
            assert proc.poll() is None and f"{name} taken" not in out.read_text()  # still waiting
        assert proc.wait(timeout=300) == 2
    finally:
        (ws / "params.yaml").write_text(good)
    text = out.read_text()
    assert f"{name} taken" in text
    assert text.count("Running stage 'curate'") == 1 and "Retry" not in text  # one attempt: input errors are final
    assert text.strip().splitlines()[-1] == "error: stage curate rejected its input (its error is above)"
    assert "error: curate.filters: the " in text and "removed every row" in text


def test_sweep_queues_a_grid_of_dvc_experiments(workspace):
    ws, run = workspace
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    assert run("git", "add", "-A").returncode == 0 and run(*git, "commit", "-q", "-m", "baseline").returncode == 0

    grid = sweep.load_grid('{"rl.stages.main.preset": [grpo, dapo], "seed": 3}')
    assert sweep.experiments(grid, "g", ws / "params.yaml") == {
        "g-1": {"rl.stages.main.preset": "grpo", "seed": 3},
        "g-2": {"rl.stages.main.preset": "dapo", "seed": 3},
    }
    with pytest.raises(
        InputError, match=r"with bad-2 \{'curate.max_test': 0\}: curate.max_test: Input should be greater than 0$"
    ):
        sweep.experiments(sweep.load_grid('{"curate.max_test": [4, 0]}'), "bad", ws / "params.yaml")

    res = run("rung", "sweep", '{"seed": [1, 2]}', "--name", "s")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert re.search(r"params.yaml:seed\s.*\s1\s.*\s2", res.stdout) and "s-1" in res.stdout and "s-2" in res.stdout

    show = json.loads(run("dvc", "exp", "show", "--json").stdout)
    exps = {e["name"]: e for b in show for e in b.get("experiments") or []}
    for i in (1, 2):
        exp = exps[f"s-{i}"]
        assert exp["executor"]["state"] == "success"
        data = exp["revs"][0]["data"]
        assert (
            data["params"]["params.yaml"]["data"]["seed"] == i
            and data["metrics"]["data/metrics/curate.json"]["data"]["train"] > 0
        )

    # One MLflow parent run per experiment, in the main repo's store (DVC sets DVC_ROOT to it), with a
    # child run for the stage it reran; the model stage came from the DVC cache.
    mlflow.set_tracking_uri(f"sqlite:///{ws / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rung"], output_format="list")
    for i in (1, 2):
        parents = [
            r
            for r in runs
            if r.data.tags.get("dvc.exp_name") == f"s-{i}" and r.data.tags.get("rung.role") == "pipeline"
        ]
        assert len(parents) == 1 and parents[0].info.status == "FINISHED"
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[0].info.run_id]
        assert [(k.info.run_name, k.data.params["seed"], k.data.tags["dvc.exp_name"]) for k in kids] == [
            ("curate", str(i), f"s-{i}")
        ]
