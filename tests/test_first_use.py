"""A new user's machine: no Prefect home, no Prefect server URL, no MLflow store, no Hugging Face
cache. The stages must work there through plain `dvc repro` (each stage starts an ephemeral Prefect
server, whose first start creates its database) and through `python -m flows.with_server`."""

from __future__ import annotations

import os
import subprocess
import sys

import mlflow
import pytest

from tests.test_pipeline import tiny_params
from tests.workspace import make_workspace


def _fresh_env(home) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_", "HF_", "RUNG_"))}
    # Fresh homes for everything that caches on first use.
    env.update(PREFECT_HOME=str(home / "prefect"), HF_HOME=str(home / "hf"), XDG_CACHE_HOME=str(home / "cache"))
    return env


@pytest.fixture
def new_user(tmp_path, tiny_model):
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws, make_workspace(ws, tiny_params(tiny_model), _fresh_env(tmp_path), stages=["model"])


@pytest.fixture
def slow_core():
    """A slow machine, made deterministic: core 0 shared with a busy process, so the first start of
    Prefect's server (database creation and migration) takes well over Prefect's 20 s default."""
    busy = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    yield ["taskset", "-c", "0"]
    busy.kill()
    busy.wait()


def test_dvc_repro_on_a_new_slow_machine_uses_the_ephemeral_server(new_user, slow_core):
    ws, run = new_user
    res = run(*slow_core, "dvc", "repro", "model")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Starting temporary server" in res.stdout + res.stderr  # the ephemeral path, not a server URL
    assert (ws / "data/models/base/config.json").is_file()
    mlflow.set_tracking_uri(f"sqlite:///{ws / 'mlflow.db'}")  # created on first use, in the repo
    runs = mlflow.search_runs(experiment_names=["rung"], output_format="list")
    assert {r.data.tags.get("dvc.stage") for r in runs} >= {"model"}


def test_with_server_runs_a_command_against_one_new_server(new_user):
    ws, run = new_user
    res = run("python", "-m", "flows.with_server", "dvc", "repro", "model")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "starting a server for this run" in res.stderr
    assert (res.stdout + res.stderr).count("Starting temporary server") <= 1  # ours; the stage started none
    # the command's exit code is passed on
    assert run("python", "-m", "flows.with_server", "python", "-c", "raise SystemExit(3)").returncode == 3
