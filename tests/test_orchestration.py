"""Orchestration end to end, on a tiny model in a temporary git + DVC repo (stages model and
curate only, to stay fast), against a real Prefect server and a real MLflow server on loopback, over
HTTPS with a generated CA as `rung serve --tls-self-signed` runs them:
prefect.yaml deployed to a process pool `gpu` and run by a worker, the workspace lock, retries
that skip input errors, and a sweep of DVC experiments (flows/sweep.py, `rung sweep`)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterKey,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.settings import (
    PREFECT_API_AUTH_STRING,
    PREFECT_API_SSL_CERT_FILE,
    PREFECT_API_URL,
    temporary_settings,
)
from typer.testing import CliRunner

from flows import credentials, serve_state, sweep
from flows import serve as team
from flows.cli import app
from flows.run import commit
from rung.errors import InputError
from tasks import dvc
from tests.conftest import free_port
from tests.test_pipeline import tiny_params
from tests.workspace import keep_stages, make_workspace

# The servers and workspace (the module's fixtures, which set os.environ), in file order: on one xdist worker.
pytestmark = pytest.mark.xdist_group("orchestration")

STAGES = ["model", "curate"]
TRAINING = ["model", "curate", "traces", "sft", "difficulty", "rl"]  # up to the RL stage, no evaluation
PLANTED = {
    "HF_TOKEN": "hf_planted0secret0token0xyz",
    "AWS_SECRET_ACCESS_KEY": "planted/aws/secret/key/0123456789",
    "WANDB_API_KEY": "planted0wandb0key0abcdef",
}


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
    """The team's servers as `rung serve --tls-self-signed` starts them (flows.serve): Prefect with basic
    auth, MLflow's basic-auth app (sqlite + proxied artifacts), credentials generated into a 0600 file,
    both over HTTPS with a CA generated into the state directory, which the clients trust through
    client.env. The directory exists beforehand with mode 0755 (as a `--dir` someone made). This process
    holds the nodes' MLflow credentials and CA for the module (the MLflow client reads them from the
    environment)."""
    state = tmp_path_factory.mktemp("servers") / "state"
    state.mkdir(mode=0o755)
    state.chmod(0o755)  # whatever the umask
    where = team.Endpoints("127.0.0.1", "127.0.0.1", free_port(), free_port())
    saved = dict(os.environ)
    # A waiting holder of a concurrency slot retries after at most this many seconds (default 30).
    os.environ["PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS"] = "1"
    try:
        with team.running(where, state, tls=True) as up:
            os.environ.update({k: v for k, v in up.env.items() if k.startswith("MLFLOW_TRACKING_")})
            yield {
                "prefect": {
                    "PREFECT_API_URL": up.env["PREFECT_API_URL"],
                    "PREFECT_API_AUTH_STRING": up.env["PREFECT_API_AUTH_STRING"],
                    "PREFECT_API_SSL_CERT_FILE": up.env["PREFECT_API_SSL_CERT_FILE"],
                    "PREFECT_HOME": str(state.parent / "prefect-client"),
                },
                "mlflow": up.env["MLFLOW_TRACKING_URI"],
                "env": up.env,
                "team": up,
                "state": state,
                "artifacts": state / "artifacts",
            }
    finally:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model, servers):
    ws = tmp_path_factory.mktemp("ws").resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    return ws, make_workspace(ws, tiny_params(tiny_model), {**env, **servers["prefect"]}, stages=STAGES)


@pytest.fixture
def prefect_client(servers):
    with (
        temporary_settings(
            {
                PREFECT_API_URL: servers["prefect"]["PREFECT_API_URL"],
                PREFECT_API_AUTH_STRING: servers["prefect"]["PREFECT_API_AUTH_STRING"],
                PREFECT_API_SSL_CERT_FILE: servers["prefect"]["PREFECT_API_SSL_CERT_FILE"],
            }
        ),
        get_client(sync_client=True) as client,
    ):
        yield client


WORKER = [sys.executable, "-m", "prefect", "worker", "start", "--pool", "gpu", "--run-once", "--limit", "1"]


def _node_env(servers: dict, ws: Path) -> dict[str, str]:
    """A GPU node's worker environment for workspace `ws`: the servers' URLs and credentials, and no venv
    on PATH (the deployment's pull step and tasks.dvc.env() must do without)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_"))}
    env.update(servers["prefect"], RUNG_REPO=str(ws), **{k: v for k, v in servers["env"].items() if "MLFLOW" in k})
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != Path(sys.executable).parent)
    return env


def _lock_is_free(ws: Path) -> bool:
    with (ws / dvc.LOCK).open() as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


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

    env = {**_node_env(servers, ws), **PLANTED}  # credentials a GPU node's environment holds: none may reach a record
    worker = subprocess.run(WORKER, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
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

    # The workspace lock: taken during the run, free after it.
    lock = ws / dvc.LOCK
    assert _lock_is_free(ws)
    # the UI's timeline reads as the DAG: task runs named by what they do, not by hash suffixes
    tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    assert sorted(t.name for t in tasks) == ["is_stale[curate]", "is_stale[model]", "repro[curate]", "repro[model]"]
    logs = [log.message for log in client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run.id])))]
    assert f"workspace lock {lock} taken" in logs
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

    # No secret in any record (_leaks), the Prefect API's logs and artifacts of the run and what the
    # worker printed included.
    leaks, records = _leaks(
        servers,
        ws,
        {
            "prefect logs": "\n".join(logs),
            "prefect artifacts": "\n".join(str(a.data) for a in client.read_artifacts()),
            "worker": worker.stdout + worker.stderr,
        },
    )
    assert not leaks and records > 50, leaks


def _leaks(servers: dict, ws: Path, texts: dict[str, str]) -> tuple[list[tuple[str, str]], int]:
    """Where a secret shows up (a planted one of PLANTED, or a server credential; its first 4 characters):
    in `texts` or any record, that is every file of both servers' state (the MLflow store and artifacts,
    both servers' logs and databases) and of workspace `ws` (dvc.lock, metrics, params copies,
    checkpoints, the DVC cache) but git's; and how many records were read."""
    secrets = [*PLANTED.values(), *serve_state.read_env_file(servers["state"] / "credentials.env").values()]
    secrets += [servers["prefect"]["PREFECT_API_AUTH_STRING"].split(":", 1)[1]]
    records = [
        *(f for f in servers["state"].rglob("*") if f.is_file() and f.suffix != ".env"),
        *(f for f in ws.rglob("*") if f.is_file() and ".git" not in f.relative_to(ws).parts),
    ]
    texts = {**{str(f): f.read_bytes().decode("latin-1") for f in records}, **texts}
    return [(where, secret[:4]) for where, text in texts.items() for secret in secrets if secret in text], len(records)


def test_two_workers_run_two_workspaces_at_once_through_a_prefect_server_restart(
    workspace, servers, prefect_client, tmp_path
):
    """Two workers on pool `gpu` each run the deployed pipeline in a workspace of their own (two clones
    of one commit and params), and the Prefect server restarts while both run: both runs complete;
    neither touches the other's outputs or MLflow parent; both workspace locks are free; and a new run
    proceeds."""
    ws, _ = workspace
    clones = [tmp_path / "a", tmp_path / "b"]
    for clone in clones:
        subprocess.run(["git", "clone", "-q", str(ws), str(clone)], check=True)
    client = prefect_client
    deployment = client.read_deployment_by_name("pipeline/pipeline")
    flow_runs = [client.create_flow_run_from_deployment(deployment.id) for _ in clones]

    def states() -> list:
        return [client.read_flow_run(r.id).state for r in flow_runs]

    workers, logs = [], [tmp_path / f"worker-{c.name}.log" for c in clones]
    for clone, log in zip(clones, logs, strict=True):
        with log.open("w") as out:
            workers.append(
                subprocess.Popen(
                    WORKER, cwd=tmp_path, env=_node_env(servers, clone), stdout=out, stderr=subprocess.STDOUT
                )
            )
        deadline = time.time() + 120  # the next worker starts once this one took its run: one each
        while sum(not s.is_scheduled() for s in states()) < len(workers):
            assert time.time() < deadline and all(w.poll() is None for w in workers), log.read_text()[-3000:]
            time.sleep(0.5)
    deadline = time.time() + 300
    while not all(s.is_running() or s.is_final() for s in states()):  # both started (~10 s of stages each)
        assert time.time() < deadline, (states(), [log.read_text()[-2000:] for log in logs])
        time.sleep(0.2)
    assert any(s.is_running() for s in states())
    servers["team"].stop("prefect")
    servers["team"].start("prefect")
    for worker, log in zip(workers, logs, strict=True):
        assert worker.wait(timeout=600) == 0, log.read_text()[-3000:]

    final = states()
    # picked up: the Prefect client retries its calls, and a stage that started while the server was away
    # stopped in its preflight ("does not answer", exit 75), which the pipeline's retries retry
    assert all(s.is_completed() for s in final), final
    mlflow.set_tracking_uri(servers["mlflow"])
    runs = mlflow.search_runs(experiment_names=["rung"], output_format="list")
    done = []
    for clone in clones:  # a parent of its own, holding its own stages only
        assert _lock_is_free(clone)
        parents = [r for r in runs if r.data.tags.get("rung.workspace", "").endswith(f":{clone}")]
        kids = [
            {r.info.run_name for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id} for p in parents
        ]
        assert len(parents) <= 1 and all(k <= {"model", "curate"} for k in kids), kids
        if (clone / "data/curated/train.jsonl").is_file():
            done.append(clone)
            assert kids == [{"model", "curate"}]
    assert len(done) >= sum(s.is_completed() for s in final)

    # a new run proceeds in the first workspace (completing what a crashed run left)
    again = client.create_flow_run_from_deployment(deployment.id)
    res = subprocess.run(
        WORKER, cwd=tmp_path, env=_node_env(servers, clones[0]), capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0 and client.read_flow_run(again.id).state.is_completed(), (
        res.stdout[-3000:] + res.stderr[-3000:]
    )
    assert (clones[0] / "data/curated/train.jsonl").is_file() and _lock_is_free(clones[0])


def test_team_servers_refuse_anyone_without_the_credentials(workspace, servers, monkeypatch):
    ws, _ = workspace
    env, state = servers["env"], servers["state"]
    # the state directory made private although it existed with 0755, and what the servers wrote (both
    # databases, mlflow-auth.db with its password hashes, logs, Prefect's home) owner-only
    assert state.stat().st_mode & 0o777 == 0o700
    assert {f.name: f.stat().st_mode & 0o777 for f in state.glob("*.env")} == {
        "credentials.env": 0o600,
        "client.env": 0o600,
    }
    written = {str(p.relative_to(state)): p.stat().st_mode & 0o777 for p in state.rglob("*")}
    assert {"mlflow-auth.db", "mlflow.db", "prefect/prefect.db", "prefect.log", "mlflow.log"} <= set(written)
    assert {p: m for p, m in written.items() if m & 0o077} == {}, written

    # both over HTTPS, trusted through the CA client.env names; without it, nothing is sent
    ca = ssl.create_default_context(cafile=env["MLFLOW_TRACKING_SERVER_CERT_PATH"])
    assert env["PREFECT_API_URL"].startswith("https://") and env["MLFLOW_TRACKING_URI"].startswith("https://")
    with pytest.raises(OSError, match="CERTIFICATE_VERIFY_FAILED"):
        credentials.http_status(f"{env['MLFLOW_TRACKING_URI']}/health")

    def status(url: str, auth: str | None = None, body: bytes | None = None) -> int:
        return credentials.http_status(url, auth, body, context=ca)

    prefect, ml = (
        f"{env['PREFECT_API_URL']}/admin/version",
        f"{env['MLFLOW_TRACKING_URI']}/api/2.0/mlflow/experiments/search?max_results=1",
    )
    right = {prefect: env["PREFECT_API_AUTH_STRING"], ml: f"rung:{env['MLFLOW_TRACKING_PASSWORD']}"}
    for url, good in right.items():
        assert status(url) == 401
        assert status(url, credentials.basic("rung:wrong")) == 401
        assert status(url, credentials.basic(good)) == 200
    # what answers without credentials (docs/orchestration.md): health and readiness, Prefect's API docs
    # and both UIs' static shells, which hold no data
    root, ml_root = env["PREFECT_API_URL"].removesuffix("/api"), env["MLFLOW_TRACKING_URI"]
    assert [status(root + path) for path in ("/api/health", "/api/ready", "/docs", "/", "/api/flows/filter")] == [
        200, 200, 200, 200, 401
    ]  # fmt: skip
    assert [status(ml_root + path) for path in ("/health", "/static-files/index.html", "/", "/docs")] == [
        200, 200, 401, 401
    ]  # fmt: skip
    # MLflow's AI gateway is off and refused: a logged-in user cannot store provider keys in the server
    secret = json.dumps({"secret_name": "k", "secret_value": {"api_key": "sk-x"}, "provider": "openai"}).encode()
    node = credentials.basic(f"rung:{env['MLFLOW_TRACKING_PASSWORD']}")
    assert status(f"{ml_root}/api/3.0/mlflow/gateway/secrets/create", node, secret) == 403

    # `rung validate` asks both servers before any compute, and says in one line which refused
    monkeypatch.chdir(ws)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    cli = CliRunner()

    def validate(
        prefect_auth: str = env["PREFECT_API_AUTH_STRING"],
        prefect_ca: str | None = env["PREFECT_API_SSL_CERT_FILE"],
        **mlflow_env: str,
    ) -> tuple[int, str]:
        for key, value in ({k: v for k, v in env.items() if "MLFLOW" in k} | mlflow_env).items():
            monkeypatch.setenv(key, value)
        prefect = {PREFECT_API_URL: env["PREFECT_API_URL"], PREFECT_API_AUTH_STRING: prefect_auth}
        with temporary_settings({**prefect, PREFECT_API_SSL_CERT_FILE: prefect_ca}):
            res = cli.invoke(app, ["validate"])
        return res.exit_code, res.output.strip().splitlines()[-1]

    url = env["MLFLOW_TRACKING_URI"]
    assert validate(MLFLOW_TRACKING_PASSWORD="wrong") == (
        2,
        f"error: MLflow at {url} refused the credentials: set MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD",
    )
    assert validate(prefect_auth="rung:wrong") == (
        2,
        f"error: Prefect at {env['PREFECT_API_URL']} refused the credentials: set PREFECT_API_AUTH_STRING",
    )
    code, line = validate(MLFLOW_TRACKING_URI=(gone := f"http://127.0.0.1:{free_port()}"))
    assert code == 75 and line.startswith(f"error: MLflow at {gone} does not answer")  # transient: retried
    # a client that does not trust the CA: one line naming the variable, not a retried outage
    code, line = validate(MLFLOW_TRACKING_SERVER_CERT_PATH="")
    assert code == 2 and line.startswith(f"error: MLflow at {url}: certificate not trusted (")
    assert line.endswith(
        "set MLFLOW_TRACKING_SERVER_CERT_PATH to the CA that signed it (rung serve --tls-self-signed: ca.pem in"
        " its directory)"
    )
    code, line = validate(prefect_ca=None)
    assert code == 2 and line.startswith(f"error: Prefect at {env['PREFECT_API_URL']}: certificate not trusted (")
    assert validate()[0] == 0

    # without auth, a non-loopback address is refused in one line unless the user says so
    res = cli.invoke(app, ["serve", "--no-auth", "--host", "0.0.0.0", "--dir", str(state)])
    assert res.exit_code == 2 and res.output.strip().endswith("add --allow-unauthenticated-network to do so anyway")
    # and with auth, not without TLS: basic auth would send the credentials in clear with every request
    res = cli.invoke(app, ["serve", "--host", "0.0.0.0", "--dir", str(state)])
    assert res.exit_code == 2 and res.output.strip().endswith("or --allow-plain-http to do so anyway")


def _request(url: str, method: str, auth: str | None, context: ssl.SSLContext, headers: dict[str, str]) -> int:
    body = json.dumps({"providers": {"ollama": {"selected": True, "base_url": "http://127.0.0.1:9"}}}).encode()
    req = urllib.request.Request(url, data=body if method != "GET" else None, method=method, headers=headers)
    req.add_header("Content-Type", "application/json")
    if auth:
        req.add_header("Authorization", auth)
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as resp:
            return resp.status
    except urllib.error.HTTPError as e:
        return e.code


def test_mlflow_serves_no_route_that_runs_code_or_configures_server_tools(servers):
    """MLflow's assistant would run a user-configured model's tool calls on the host for any request from
    loopback (a same-host proxy, a tunnel): its config, chat and every other route that runs code (jobs,
    invoke, the gateway, MCP server records) are refused to the admin, the nodes' user and anyone, however
    the path is spelled and whatever X-Forwarded-For says, while the tracking API still answers."""
    env, state = servers["env"], servers["state"]
    ca = ssl.create_default_context(cafile=env["MLFLOW_TRACKING_SERVER_CERT_PATH"])
    admin = dict(line.split("=", 1) for line in (state / "credentials.env").read_text().split() if "=" in line)
    users = {
        "admin": credentials.basic(f"admin:{admin['MLFLOW_ADMIN_PASSWORD']}"),
        "node": credentials.basic(f"rung:{env['MLFLOW_TRACKING_PASSWORD']}"),
        "anyone": None,
    }
    root = env["MLFLOW_TRACKING_URI"]
    routes = [
        ("PUT", "/ajax-api/3.0/mlflow/assistant/config"),
        ("GET", "/ajax-api/3.0/mlflow/assistant/config"),
        ("POST", "/ajax-api/3.0/mlflow/assistant/message"),
        ("PUT", "//ajax-api/3.0/mlflow/assistant/config"),
        ("PUT", "/ajax-api/3.0/mlflow/%61ssistant/config"),
        ("PUT", "/ajax-api/3.0/mlflow/runs/../assistant/config"),
        ("POST", "/ajax-api/3.0/jobs/search"),
        ("POST", "/ajax-api/3.0/mlflow/scorer/invoke"),
        ("POST", "/ajax-api/3.0/mlflow/mcp-servers"),
        ("POST", "/api/3.0/mlflow/gateway/secrets/create"),
    ]
    seen = {
        (who, method, path, forwarded): _request(root + path, method, auth, ca, forwarded_for)
        for who, auth in users.items()
        for method, path in routes
        for forwarded, forwarded_for in (("none", {}), ("loopback", {"X-Forwarded-For": "127.0.0.1"}))
    }
    assert {k: v for k, v in seen.items() if v != 403} == {}
    # the tracking API answers as before
    assert (
        credentials.http_status(f"{root}/api/2.0/mlflow/experiments/search?max_results=1", users["node"], context=ca)
        == 200
    )


HOLDER = """import fcntl, sys, time
f = open(sys.argv[1], "a+")
fcntl.flock(f, fcntl.LOCK_EX)
f.write("the test's holder"); f.flush(); print("held", flush=True); time.sleep(600)
"""


def test_a_killed_holder_frees_the_workspace_lock_and_input_errors_are_not_retried(workspace, tmp_path):
    """Another run holds the workspace; the pipeline waits. The holder is then killed (as a run is when
    its node or Prefect server goes away): the kernel frees its lock and the pipeline proceeds."""
    ws, run = workspace
    assert dvc.repro.retries == 2 and dvc.repro.retry_delay_seconds == [30, 60]  # exponential backoff
    good = (ws / "params.yaml").read_text()
    params = yaml.safe_load(good)
    # passes the preflight, but curate rejects it when it runs (every row filtered out): exit 2
    params["curate"]["filters"].update(min_chars=100000, max_chars=200000)
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    lock = ws / dvc.LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdout=subprocess.PIPE, text=True)
    out = tmp_path / "pipeline.out"
    try:
        assert holder.stdout.readline().strip() == "held"
        with out.open("w") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "flows.pipeline"], cwd=ws, env=run.env, stdout=f, stderr=subprocess.STDOUT
            )
        deadline = time.time() + 120
        while "waiting for workspace lock" not in out.read_text():
            assert proc.poll() is None and time.time() < deadline, out.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)
        assert proc.poll() is None and f"{lock} taken" not in out.read_text()  # still waiting
        assert "(held by the test's holder)" in out.read_text()
        holder.kill()
        assert proc.wait(timeout=300) == 2
    finally:
        holder.kill()
        (ws / "params.yaml").write_text(good)
    text = out.read_text()
    assert f"{lock} taken" in text
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


def test_training_stages_leak_no_secret(workspace, servers):
    """The secret scan over the SFT and RL stages too (the deployed run above has model and curate only):
    the trainers hand their whole config to MLflow, and TRL and transformers read the environment. The
    pipeline flow runs them, on the tiny model for 2 steps each, in a node's environment holding the
    planted secrets; nothing of them, nor of the servers' credentials, may reach a record. In the module's
    workspace, its DAG grown to the training stages: the model stage the deployed run ran is up to date (curate's
    outputs come back from DVC's run cache), and the scan covers what every test above wrote there too."""
    ws, run = workspace
    keep_stages(ws, TRAINING)
    commit(ws, "the training stages", run.env)
    res = subprocess.run(
        [sys.executable, "-m", "flows.pipeline"],
        cwd=ws,
        env={**_node_env(servers, ws), **PLANTED},
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (ws / "data/models/rl/main/model.safetensors").is_file()
    mlflow.set_tracking_uri(servers["mlflow"])
    runs = mlflow.search_runs(experiment_names=["rung"], output_format="list")
    trained = {r.info.run_name: r for r in runs if r.data.tags.get("rung.workspace", "").endswith(f":{ws}")}
    trained |= {
        r.info.run_name: r
        for r in runs
        if r.data.tags.get("mlflow.parentRunId") in {p.info.run_id for p in trained.values()}
    }
    assert {"sft", "rl@main"} <= set(trained) and all(len(trained[n].data.params) > 20 for n in ("sft", "rl@main"))
    leaks, records = _leaks(servers, ws, {"pipeline": res.stdout + res.stderr})
    assert not leaks and records > 50, leaks
