"""MLflow runs whose owner process died (a killed stage or `dvc repro`) are closed as KILLED."""

from __future__ import annotations

import socket
import subprocess
import sys

import mlflow
import psutil

from rung import tracking


def test_runs_of_dead_processes_are_closed_as_killed(tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = mlflow.set_experiment("t").experiment_id
    client = mlflow.MlflowClient()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    dead = client.create_run(exp, tags={tracking.OWNER_TAG: f"{socket.gethostname()}:{gone.pid}-0"})
    alive = client.create_run(exp, tags={tracking.OWNER_TAG: tracking._owner(psutil.Process())})
    elsewhere = client.create_run(exp, tags={tracking.OWNER_TAG: f"other-host:{gone.pid}-0"})
    assert tracking.close_orphans(exp) == [dead.info.run_id]
    status = {r: client.get_run(r).info.status for r in (dead.info.run_id, alive.info.run_id, elsewhere.info.run_id)}
    assert status == {dead.info.run_id: "KILLED", alive.info.run_id: "RUNNING", elsewhere.info.run_id: "RUNNING"}
