"""MLflow: runs whose owner process died (a killed stage or `dvc repro`) are closed as KILLED; the
parent run of an experiment and who joins it; metric keys shared by checkpoints; logged models."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import psutil
import yaml

from flows import stage
from rung import config, tracking
from rung.eval.results import Comparisons, EvalResult
from rung.files import flatten
from rung.report import keys
from tests.conftest import ROOT
from tests.test_config import CREDENTIALS, LOOKALIKES

CHECKPOINTS = [("base", "base"), ("sft", "sft"), ("rl/main", "rl-main")]
FIXTURES = ROOT / "tests/fixtures/report"


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


def test_eval_runs_share_metric_keys_and_parents_get_the_headlines():
    """MLflow lines checkpoints up by metric key: every checkpoint's eval run has the same keys
    (`<set>/<metric>`), settings are not among them; the parent gets one key per checkpoint."""
    evals = {c: EvalResult.model_validate_json((FIXTURES / f"eval-{s}.json").read_text()) for c, s in CHECKPOINTS}
    names = {c: set(keys.eval_metrics(e)) for c, e in evals.items()}
    assert names["base"] == names["sft"] == names["rl/main"]
    test = keys.eval_metrics(evals["rl/main"])
    assert test["test/accuracy"] == evals["rl/main"].sets["test"].accuracy
    assert test["test/pass_at_4"] == evals["rl/main"].sets["test"].pass_at_k["4"]
    assert test["test/avg_at_4"] == evals["rl/main"].sets["test"].avg_at_n()["avg@4"]
    ci = evals["rl/main"].sets["chain_sum_4terms"].accuracy_ci
    assert [test["chain_sum_4terms/accuracy_ci_low"], test["chain_sum_4terms/accuracy_ci_high"]] == ci
    assert not [k for k in test if k.split("/")[0] in ("sampling", "samples", "bootstrap", "seed")]

    compared = Comparisons.model_validate_json((FIXTURES / "comparisons.json").read_text())
    heads = keys.headline_metrics(evals, compared, {"main": "sft"})
    rl_vs_sft = compared.comparisons["rl-main-vs-sft"].sets["test"]
    paired = {
        f"paired/rl-main-vs-sft/test/{k}": getattr(rl_vs_sft, k)
        for k in ("difference", "ci_low", "ci_high", "mcnemar_p")
    }
    assert {k: v for k, v in heads.items() if k.startswith("paired/")} == paired
    assert set(heads) - set(paired) == {
        f"eval/{s}/test/{k}" for _, s in CHECKPOINTS for k in ("accuracy", "avg_at_4", "pass_at_4")
    }
    assert heads["eval/sft/test/accuracy"] == evals["sft"].sets["test"].accuracy


def _git_repo(path: Path, params_text: str) -> None:
    (path / "params.yaml").write_text(params_text)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for cmd in (["git", "init", "-q"], ["git", "add", "-A"], [*git, "commit", "-q", "-m", "p"]):
        subprocess.run(cmd, cwd=path, check=True, capture_output=True)


def test_a_stage_run_alone_joins_the_parent_of_its_commit_and_params(tmp_path, monkeypatch, capsys):
    """`python -m flows.<stage>` alone: the first makes the experiment's parent (flattened params,
    tags naming it, params.yaml), the next stage with the same commit and params joins it, other
    params make a new parent; each says which on stderr."""
    text = "# rung run recipes/dapo.yaml --set seed=42\n" + (ROOT / "params.yaml").read_text()
    _git_repo(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for var in (tracking.PARENT_ENV, "DVC_EXP_NAME", "DVC_ROOT"):
        monkeypatch.delenv(var, raising=False)
    params = config.load("params.yaml")

    def stage(name: str, p: config.Params) -> str:
        with tracking.stage_run(name, p, logged={}, inputs={}) as run:
            pass
        return mlflow.get_run(run.info.run_id).data.tags["mlflow.parentRunId"]

    first = stage("curate", params)
    assert "MLflow: new parent run 'stage " in capsys.readouterr().err
    assert stage("sft", params) == first
    assert "MLflow: adding to parent run 'stage " in capsys.readouterr().err
    other = stage("curate", params.model_copy(update={"seed": 7}))
    assert other != first and "no parent run of commit" in capsys.readouterr().err

    parent = mlflow.get_run(first)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert parent.info.status == "FINISHED"
    assert {k: parent.data.tags[k] for k in ("git.commit", "rung.seed", "rung.recipe", "rung.params_md5")} == {
        "git.commit": commit,
        "rung.seed": "42",
        "rung.recipe": "dapo",
        "rung.params_md5": tracking.params_md5(params),
    }
    assert parent.data.params["rl.stages.main.learning_rate"] == str(params.rl.stages["main"].learning_rate)
    assert json.loads(parent.data.params["eval.sets"])[0]["name"] == params.eval.sets[0].name
    assert len(parent.data.params) == len(flatten(params.model_dump()))
    assert mlflow.get_run(other).data.params["seed"] == "7"
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(first)] == ["params.yaml"]


def test_no_credential_of_a_params_yaml_reaches_the_mlflow_store(tmp_path, monkeypatch, capsys):
    """Each credential of tests/test_config.py's table, in the params.yaml of a stage run alone: the stage's
    entry (flows.stage.main) refuses it in one line naming its key (exit 2), and nothing of it reaches the
    MLflow store (sqlite and artifacts: the parent's params, tags, run name and params.yaml, the stage run's
    params). The scan can see: a stage on the look-alikes runs, and their values are found in the store."""
    default = yaml.safe_load((ROOT / "params.yaml").read_text())
    _git_repo(tmp_path, yaml.safe_dump(default))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for var in (tracking.PARENT_ENV, "DVC_EXP_NAME", "DVC_ROOT", "DVC_STAGE"):
        monkeypatch.delenv(var, raising=False)

    def flow() -> None:  # what a stage logs: its params on its run; every param and params.yaml on the parent
        params = config.load("params.yaml")
        with tracking.stage_run("probe", params, logged=params.model_dump(mode="json"), inputs={}):
            pass

    def run(edits: dict) -> tuple[int, str]:
        (tmp_path / "params.yaml").write_text(yaml.safe_dump(config.with_overrides(default, edits)))
        try:
            stage.main(flow)
        except SystemExit as e:
            return int(e.code), capsys.readouterr().err
        return 0, capsys.readouterr().err

    for key, value, secret, expected in CREDENTIALS:
        code, err = run({key: value})
        assert code == 2 and err.startswith(f"error: params.yaml: {expected}") and secret not in err, (key, err)
    assert run(LOOKALIKES)[0] == 0
    records = [f for f in tmp_path.rglob("*") if f.is_file() and f.name != "params.yaml" and ".git" not in f.parts]
    store = "\n".join(f.read_bytes().decode("latin-1") for f in records)
    assert "/run/secrets/hf" in store and "git+ssh://git@github.com/o/r" in store  # the look-alikes' values
    assert [secret for _, _, secret, _ in CREDENTIALS if secret in store] == []


def test_a_checkpoint_goes_in_as_a_transformers_logged_model(tiny_model, tmp_path):
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = mlflow.create_experiment("t", artifact_location=(tmp_path / "artifacts").as_uri())
    with mlflow.start_run(experiment_id=exp) as run:
        model_id = tracking.log_model(tiny_model)
    [logged] = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert (logged.model_id, logged.name, logged.source_run_id) == (model_id, "checkpoint", run.info.run_id)
    flavor = mlflow.models.get_model_info(logged.model_uri).flavors["transformers"]
    assert flavor["task"] == "text-generation" and flavor["instance_type"] == "TextGenerationPipeline"
