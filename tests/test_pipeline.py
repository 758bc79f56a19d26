"""End to end: the whole DAG with `dvc repro` and with the Prefect pipeline flow, on a tiny model,
in a temporary git repo, against a real Prefect server (loopback) and a real MLflow sqlite store."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlflow
import pytest
import yaml
from typer.testing import CliRunner

from flows.cli import app
from flows.run import commit
from rung.report import keys
from rung.train.checkpoints import CURRICULUM_STATE, complete_checkpoints
from tests.conftest import ROOT, free_port, serve, wait_healthy
from tests.test_html_report import CHROMIUM, chromium
from tests.workspace import make_workspace

# One workspace (the module's fixture), its tests in file order: on one xdist worker (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("pipeline")

STAGES = {
    "model",
    "curate",
    "difficulty",
    "traces",
    "sft",
    "rl@main",
    "eval@base",
    "eval@sft",
    "eval@rl-main",
    "report",
}


def tiny_params(model_dir: Path) -> dict:
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["model"]["source"] = str(model_dir)
    for src in params["curate"]["sources"]:
        src["size"] = 40
    params["curate"]["max_test"] = 8
    params["difficulty"].update(
        num_generations=2, max_prompts=8, reference="sft", sampling=dict(max_new_tokens=8, batch_size=16)
    )
    params["sft"].update(max_steps=2, per_device_train_batch_size=2)
    params["rl"]["stages"]["main"].update(max_steps=2, num_generations=2, max_completion_length=8, beta=0.01)
    params["eval"]["sampling"]["max_new_tokens"] = 8
    params["eval"]["samples"] = dict(n=3, temperature=1.0, max_new_tokens=6, max_prompts=4)
    params["eval"]["sets"] = [
        dict(
            name="ood_chain",
            task="chain_sum",
            size=6,
            config=dict(min_terms=4, max_terms=4, min_digits=1, max_digits=1),
        )
    ]
    return params


@pytest.fixture(scope="module")
def workspace(tmp_path_factory, tiny_model, prefect_server):
    """A git + DVC repo holding the project's files, with params pointing at the tiny model."""
    ws = tmp_path_factory.mktemp("ws")
    env = {**os.environ, **prefect_server}
    env.pop("MLFLOW_TRACKING_URI", None)  # the default store: sqlite at <repo>/mlflow.db
    return ws, make_workspace(ws, tiny_params(tiny_model), env)


def run_order(ws: Path) -> list[str]:
    """The workspace's DVC stages in the order they run, by name, from outside it (DVC's addresses would carry
    the path of its dvc.yaml from here: `../ws/dvc.yaml:model`)."""
    from tasks.dvc import stages_in_order

    return stages_in_order(ws)


def _runs(ws: Path) -> list:
    mlflow.set_tracking_uri(f"sqlite:///{ws / 'mlflow.db'}")
    return mlflow.search_runs(experiment_names=["rung"], output_format="list")


def test_dvc_repro_runs_every_stage(workspace, tmp_path):
    ws, run = workspace
    res = run("dvc", "repro")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    for path in [
        "data/models/base/model.safetensors",
        "data/models/sft/model.safetensors",
        "data/models/rl/main/model.safetensors",
        "data/curated/train.jsonl",
        "data/curated/test.jsonl",
        "data/difficulty/scores.jsonl",
        "data/sft/traces.jsonl",
        "data/difficulty/train.jsonl",
        "data/curated/eval/ood_chain.jsonl",
        "data/eval/base/test.jsonl",
        "data/eval/sft/ood_chain.jsonl",
        "data/eval/rl-main/test.samples.jsonl",
        "data/reports/report.md",
        "data/reports/report.html",
        "data/plots/rl/main.json",
        "data/plots/pass_at_k/sft.json",
        "data/plots/accuracy_by_difficulty/base.json",
        "data/plots/difficulty/pass_rate.json",
        "data/plots/curate/prompt_length.json",
        "data/plots/curate/difficulty.json",
    ]:
        assert (ws / path).is_file(), path
    assert json.loads((ws / "data/models/sft/rung.json").read_text())["stage"] == "sft"
    assert sum(json.loads((ws / "data/metrics/difficulty.json").read_text())["buckets"].values()) == 8

    test_rows = (ws / "data/curated/test.jsonl").read_text().splitlines()
    assert 0 < len(test_rows) <= 8  # max_test; filters may leave fewer
    for ckpt in ("base", "sft", "rl-main"):
        m = json.loads((ws / f"data/metrics/eval-{ckpt}.json").read_text())
        test = m["sets"]["test"]
        assert test["n"] == len(test_rows) and 0 <= test["accuracy"] <= 1 and m["sampling"]["temperature"] == 0
        assert test["accuracy_ci"][0] <= test["accuracy"] <= test["accuracy_ci"][1]
        assert (
            set(test["pass_at_k"]) == {"1", "2", "3"} and "avg@3" in test and set(test["maj_at_k"]) == {"1", "2", "3"}
        )
        assert set(test["pass_at_k_band"]) == {"1", "2", "3"} and test["coverage"] == test["pass_at_k"]["3"]
        assert (
            m["sets"]["ood_chain"]["n"] == 6
            and len(m["model_md5"]) == 32
            and set(m["data_md5"]) == {"test", "ood_chain"}
        )
    assert [p["k"] for p in json.loads((ws / "data/plots/pass_at_k/sft.json").read_text())] == [1, 2, 3]
    assert [c["step"] for c in json.loads((ws / "data/plots/rl/main.json").read_text())] == [1, 2]
    report = (ws / "data/reports/report.md").read_text()
    for ckpt in ("| base |", "| sft |", "| rl/main |"):
        assert ckpt in report
    assert "pass@k spectrum on test:" in report and "Coverage: the share of prompts solved at least once" in report
    # a random tiny model is degenerate: the report and the MLflow runs say so
    assert (
        "Warnings (rung.health):" in report and "eval-base: the model never follows the answer format on test" in report
    )

    # Paired comparisons: a DVC metrics file, the reports, MLflow (the report run and the parent).
    compared = json.loads((ws / "data/reports/comparisons.json").read_text())
    assert set(compared["comparisons"]) == {
        "sft-vs-base",
        "rl-main-vs-sft",
        "rl-main-vs-base",
    }  # (the file's keys are sorted)
    assert (compared["level"], compared["resamples"]) == (0.05, 1000)
    for c in compared["comparisons"].values():
        assert set(c["sets"]) == {"test", "ood_chain"}
        test = c["sets"]["test"]
        assert test["n"] == len(test_rows) and test["ci_low"] <= test["difference"] <= test["ci_high"]
        assert 0 <= test["mcnemar_p"] <= 1 and test["verdict"] in (
            "significant at 0.05 (exact McNemar)",
            "not significant at 0.05 (exact McNemar)",
        )
        sampled = test["sampled"]  # one family, one test: avg@n and pass@k at every k together
        assert set(sampled) == {"n", "samples", "family", "test", "boundary", "avg@3", "pass@1", "pass@2", "pass@3"}
        assert set(sampled["family"]) == {"avg@3", "pass@1", "pass@2", "pass@3"} and sampled["test"]
    rl_vs_sft = compared["comparisons"]["rl-main-vs-sft"]["sets"]["test"]
    assert (
        "## Paired comparisons" in report
        and f"| rl/main vs sft | test | {len(test_rows)} |" in report
        and rl_vs_sft["verdict"] in report
    )
    assert '<table id="paired">' in (ws / "data/reports/report.html").read_text()
    shown = run("dvc", "metrics", "show", "--json")
    assert shown.returncode == 0 and "data/reports/comparisons.json" in shown.stdout and "mcnemar_p" in shown.stdout
    table = run("rung", "table")
    assert table.returncode == 0 and "Paired comparisons" in table.stdout and "McNemar" in table.stdout

    # then where the time went: every stage ran in this run (a plain `dvc repro`, marked by its first stage)
    def timed(output: str) -> list[list[str]]:
        rows = output[output.index("Wall time per stage") :].splitlines()
        return [line.split()[:2] for line in rows if line.split()[1:2] in (["ran"], ["cached"])]

    assert timed(table.stdout) == [[stage, "ran"] for stage in run_order(ws)]
    # as `rung run` prints it, from outside the workspace: the same rows (not "runs/x/dvc.yaml:model  cached")
    outside = CliRunner().invoke(app, ["table", str(ws / "data/reports/report.md")])
    assert outside.exit_code == 0 and timed(outside.output) == timed(table.stdout), outside.output

    shown = run("dvc", "metrics", "show", "--json")
    assert shown.returncode == 0 and "eval-rl-main.json" in shown.stdout
    plots = run("dvc", "plots", "show", "--json")
    assert plots.returncode == 0 and "pass_at_k/sft.json" in plots.stdout and "rl/main.json" in plots.stdout
    assert "ood_chain (eval set)" in (ws / "data/reports/report.html").read_text()

    runs = _runs(ws)
    parents = [r for r in runs if r.data.tags.get("rung.role") == "pipeline"]
    children = [r for r in runs if r.data.tags.get("rung.role") == "stage"]
    assert len(parents) == 1
    commit = run("git", "rev-parse", "HEAD").stdout.strip()
    assert parents[0].info.run_name == f"repro {commit[:7]}" and parents[0].data.tags["rung.invocation"] == "repro"
    assert (
        mlflow.get_experiment_by_name("rung").tags["mlflow.experimentKind"] == "finetuning"
    )  # the UI opens on training runs
    assert {r.info.run_name for r in children} == STAGES and len(children) == len(STAGES)
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in children)
    # each stage's wall time on its run and, one key per stage, on the parent: as data/timings/ has it
    for r in children:
        timing = json.loads((ws / f"data/timings/{r.data.tags['dvc.stage']}.json").read_text())
        assert r.data.metrics[keys.STAGE_DURATION] == timing["seconds"] > 0
        assert parents[0].data.metrics[keys.stage_duration(timing["stage"])] == timing["seconds"]
    by_name = {r.info.run_name: r for r in children}
    sft, rl = by_name["sft"], by_name["rl@main"]
    assert sft.data.tags["dvc.stage"] == "sft" and len(sft.data.tags["git.commit"]) == 40
    assert sft.data.tags["md5.model"] and sft.data.tags["version.trl"]
    client = mlflow.MlflowClient()
    assert len(client.get_metric_history(sft.info.run_id, "loss")) == 2  # per step
    # how far each training stage moved the weights: per step, and at the end from its init (issue 36)
    for trained, prefix in ((sft, "sft"), (rl, "rl")):
        assert len(client.get_metric_history(trained.info.run_id, "update/relative")) == 2
        assert {f"{prefix}/weights_changed_share", f"{prefix}/weights_relative_change"} <= set(trained.data.metrics)
    assert sft.data.metrics["sft/weights_changed_share"] > 0.99
    for key in (
        "reward",
        "kl",
        "entropy",
        "completions/mean_length",
        "rewards/accuracy/mean",
        "rewards/overlong/mean",
        "frac_reward_zero_std",
        "frac_zero_std_trained",
        "dynamic_sampling/rounds",
        "curriculum/size/normal",
        "curriculum/drawn_pass_rate",
    ):
        assert len(client.get_metric_history(rl.info.run_id, key)) == 2, (
            key
        )  # per step: the dapo preset, pools curriculum
    assert any(k.startswith("accuracy_by_bucket/") for k in rl.data.metrics)
    # One key per quantity: every checkpoint's eval run logs the same keys; the checkpoint is a tag.
    evals = {c: by_name[f"eval@{c.replace('/', '-')}"] for c in ("base", "sft", "rl/main")}
    assert len({frozenset(r.data.metrics) for r in evals.values()}) == 1
    assert {"test/accuracy", "test/pass_at_3", "test/avg_at_3", "ood_chain/accuracy"} <= set(evals["sft"].data.metrics)
    assert not [k for k in evals["sft"].data.metrics if k.startswith(("sampling", "samples", "bootstrap", "eval-"))]
    assert (
        evals["sft"].data.metrics["test/accuracy"]
        == json.loads((ws / "data/metrics/eval-sft.json").read_text())["sets"]["test"]["accuracy"]
    )
    assert [(r.data.tags["rung.checkpoint"], r.data.params["init"]) for r in evals.values()] == [
        ("base", yaml.safe_load((ws / "params.yaml").read_text())["model"]["source"]),
        ("sft", "base"),
        ("rl/main", "sft"),
    ]
    # Each training run names the checkpoint it wrote, its DVC md5 (as in dvc.lock) and its init.
    lock = yaml.safe_load((ws / "dvc.lock").read_text())["stages"]
    for run_name, stage, out, init in (
        ("sft", "sft", "data/models/sft", "base"),
        ("rl@main", "rl@main", "data/models/rl/main", "sft"),
    ):
        [locked] = [o["md5"] for o in lock[stage]["outs"] if o["path"] == out]
        tags = by_name[run_name].data.tags
        assert (tags["rung.model_dir"], tags["rung.model_dvc_md5"], tags["rung.init"]) == (out, locked, init)
    assert "rl/reward_last" in rl.data.metrics and not [k for k in rl.data.metrics if k.startswith("rl-main/")]
    assert "never follows the answer format" in by_name["eval@base"].data.tags["rung.warnings"]
    paired = by_name["report"].data.metrics
    assert paired["paired/rl-main-vs-sft/test/mcnemar_p"] == pytest.approx(rl_vs_sft["mcnemar_p"])
    assert paired["paired/rl-main-vs-sft/test/significant"] == float(rl_vs_sft["significant"])
    assert (
        "paired/sft-vs-base/ood_chain/wrong_to_right" in paired
        and "paired/rl-main-vs-base/test/sampled/avg_at_3/ci_low" in paired
    )
    # The parent is the experiment: its params, tags and headline metrics (one row in MLflow's runs table).
    head = parents[0].data
    assert head.params["seed"] == "42" and head.params["rl.stages.main.max_steps"] == "2"
    assert head.tags["rung.seed"] == "42" and head.tags["git.commit"] == commit
    for ckpt in ("base", "sft", "rl-main"):
        test = json.loads((ws / f"data/metrics/eval-{ckpt}.json").read_text())["sets"]["test"]
        assert head.metrics[f"eval/{ckpt}/test/accuracy"] == test["accuracy"]
        assert head.metrics[f"eval/{ckpt}/test/avg_at_3"] == test["avg@3"]
        assert head.metrics[f"eval/{ckpt}/test/pass_at_3"] == test["pass_at_k"]["3"]
    assert head.metrics["paired/rl-main-vs-sft/test/difference"] == pytest.approx(rl_vs_sft["difference"])
    assert head.metrics["paired/rl-main-vs-sft/test/mcnemar_p"] == pytest.approx(rl_vs_sft["mcnemar_p"])
    assert {a.path for a in client.list_artifacts(parents[0].info.run_id)} >= {
        "paired_greedy.json",
        "paired_sampled.json",
        "paired_comparisons.md",
        "report.md",
        "report.html",
        "params.yaml",
    }
    table = json.loads(
        Path(client.download_artifacts(parents[0].info.run_id, "paired_greedy.json", str(tmp_path))).read_text()
    )
    rows = [dict(zip(table["columns"], r, strict=True)) for r in table["data"]]
    [verdict] = [
        r["verdict"] for r in rows if r["comparison (new vs old)"] == "rl/main vs sft" and r["eval set"] == "test"
    ]
    assert verdict.startswith(rl_vs_sft["verdict"])  # a non-significant one adds what a significant result would need
    assert "test/pass_at_3" in by_name["eval@sft"].data.metrics
    assert by_name["eval@sft"].data.metrics["throughput/tokens_per_s"] > 0
    assert {a.path for a in client.list_artifacts(by_name["eval@sft"].info.run_id, "plots")} == {
        "plots/pass_at_k-test.svg",
        "plots/pass_at_k-ood_chain.svg",
    }
    assert {a.path for a in client.list_artifacts(by_name["eval@sft"].info.run_id, "samples")} >= {
        "samples/test.jsonl",
        "samples/ood_chain.jsonl",
    }
    assert (
        by_name["curate"].inputs.dataset_inputs[0].dataset.digest
        == run("md5sum", "data/curated/train.jsonl").stdout.split()[0]
    )

    again = run("dvc", "repro")
    assert again.returncode == 0 and "Running stage" not in again.stdout


def _stale(run: Callable[..., subprocess.CompletedProcess]) -> set[str]:
    res = run("dvc", "status", "--json")
    assert res.returncode == 0, res.stderr
    return set(json.loads(res.stdout))


def test_editing_a_reward_makes_only_the_rl_stage_stale(workspace):
    """DVC's fine-grained reruns: a stage's deps are the code it imports, so a reward edit touches RL
    alone (its outputs then change the eval and report stages' data deps when it reruns)."""
    ws, run = workspace
    assert _stale(run) == set()
    rewards = ws / "rung/rl/rewards.py"
    original = rewards.read_text()
    rewards.write_text(original + "\n# an edit\n")
    try:
        assert _stale(run) == {"rl@main"}
    finally:
        rewards.write_text(original)
    assert _stale(run) == set()


def test_editing_a_report_warning_makes_only_the_report_stale(workspace):
    """The stages import the report layer only for their records (MLflow names, tags, warning lines):
    it is not their DVC code dep, and the report recomputes the warnings from the metrics files."""
    ws, run = workspace
    health = ws / "rung/report/health.py"
    original = health.read_text()
    health.write_text(original.replace("and were truncated", "and were cut"))
    try:
        assert _stale(run) == {"report"}
    finally:
        health.write_text(original)


def test_the_report_is_a_function_of_its_declared_deps(workspace):
    """At a later commit with the same code, params and data, the report stage rewrites its outputs
    byte for byte, so the committed dvc.lock stays true (the commit is an MLflow tag, not an output).
    The commit and the MLflow runs it started are undone after, for the runs-table tests below."""
    ws, run = workspace
    before, runs = _snapshot(ws, "data/reports", "dvc.lock"), {r.info.run_id for r in _runs(ws)}
    assert run("git", "commit", "-q", "--allow-empty", "-m", "a later commit").returncode == 0
    try:
        res = run("dvc", "repro", "--force", "--single-item", "report")
        assert res.returncode == 0 and "Running stage 'report'" in res.stdout, res.stdout + res.stderr
        assert _snapshot(ws, "data/reports", "dvc.lock") == before
    finally:
        assert run("git", "reset", "-q", "--soft", "HEAD~1").returncode == 0
        for r in _runs(ws):
            if r.info.run_id not in runs:
                mlflow.MlflowClient().delete_run(r.info.run_id)


def test_earlier_params_are_restored_from_the_run_cache(workspace):
    ws, run = workspace
    curated = _snapshot(ws, "data/curated")
    original = (ws / "params.yaml").read_text()
    params = yaml.safe_load(original)
    params["curate"]["max_test"] = 7
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    res = run("dvc", "repro", "curate")
    assert res.returncode == 0 and "Running stage 'curate'" in res.stdout, res.stdout + res.stderr
    (ws / "params.yaml").write_text(original)
    res = run("dvc", "repro", "curate")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Stage 'curate' is cached - skipping run, checking out outputs" in res.stdout
    assert _snapshot(ws, "data/curated") == curated and _stale(run) == set()


def test_a_remote_round_trip_reruns_nothing(workspace, tmp_path):
    """`dvc push` here, `git clone` + `dvc pull` elsewhere: every output comes back, `dvc repro` has
    nothing to run and `rung table` prints the same table."""
    ws, run = workspace
    remote = tmp_path / "remote"
    for cmd in (("dvc", "remote", "add", "-d", "store", str(remote)), ("dvc", "push")):
        res = run(*cmd)
        assert res.returncode == 0, res.stdout + res.stderr
    commit(ws, "a run of the pipeline", run.env)
    clone = tmp_path / "clone"
    res = subprocess.run(["git", "clone", "-q", str(ws), str(clone)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr

    def there(*cmd: str) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, cwd=clone, env=run.env, capture_output=True, text=True)

    res = there("dvc", "pull")
    assert res.returncode == 0, res.stdout + res.stderr
    for path in ("data/models/rl/main/model.safetensors", "data/reports/report.md", "data/metrics/eval-sft.json"):
        assert (clone / path).read_bytes() == (ws / path).read_bytes()
    res = there("dvc", "repro")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "Running stage" not in res.stdout and "is cached" not in res.stdout
    assert json.loads(there("dvc", "status", "--json").stdout) == {}
    # the same results; the stage times are the workspace's records of its runs, which a clone has none of
    here, cloned = run("rung", "table").stdout, there("rung", "table").stdout
    assert cloned != "" and here.startswith(cloned) and "Wall time per stage" in here[len(cloned) :]


def test_pipeline_flow_runs_only_stale_stages(workspace, tmp_path):
    ws, run = workspace
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["eval"]["sampling"]["max_new_tokens"] = 6
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    sft_before = (ws / "data/models/sft/model.safetensors").stat().st_mtime

    res = run(sys.executable, "-m", "flows.pipeline")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (ws / "data/models/sft/model.safetensors").stat().st_mtime == sft_before
    assert json.loads((ws / "data/metrics/eval-base.json").read_text())["sampling"]["max_new_tokens"] == 6

    parent = [r for r in _runs(ws) if r.data.tags.get("rung.invocation") == "pipeline"]
    commit = run("git", "rev-parse", "HEAD").stdout.strip()
    assert len(parent) == 1 and parent[0].info.status == "FINISHED"
    assert (
        parent[0].info.run_name == f"pipeline {commit[:7]} (eval.sampling.max_new_tokens=6)"
    )  # what it ran: the commit and the change
    assert parent[0].data.tags["rung.stages_run"] == "eval_base,eval_sft,eval_rl@main,report"
    kids = [r for r in _runs(ws) if r.data.tags.get("mlflow.parentRunId") == parent[0].info.run_id]
    assert {r.info.run_name for r in kids} == {"eval@base", "eval@sft", "eval@rl-main", "report"}
    # the parent's per-stage summary: the stages this run reran with their wall time, the others cached
    summary = Path(mlflow.MlflowClient().download_artifacts(parent[0].info.run_id, "stages.md", str(tmp_path)))
    ran = {"eval_base", "eval_sft", "eval_rl@main", "report"}
    for stage in run_order(ws):
        status = "ran" if stage in ran else "cached"
        assert re.search(rf"^\| {re.escape(stage)} \| {status} \|", summary.read_text(), re.M), stage

    # Two experiments (the first `dvc repro`, this one) compare in MLflow's runs table on one row each:
    # their parents, with the headline metrics as columns and the params that differ side by side.
    table = mlflow.search_runs(
        experiment_names=["rung"],
        filter_string="tags.`rung.role` = 'pipeline' and metrics.`eval/sft/test/accuracy` >= 0",
    )
    assert len(table) == 2 and set(table["tags.rung.invocation"]) == {"repro", "pipeline"}
    headline = [
        f"metrics.eval/{c}/test/{k}" for c in ("base", "sft", "rl-main") for k in ("accuracy", "avg_at_3", "pass_at_3")
    ]
    assert table[[*headline, "metrics.paired/rl-main-vs-sft/test/mcnemar_p"]].notna().all().all()
    assert sorted(table["params.eval.sampling.max_new_tokens"]) == ["6", "8"]
    assert (table["params.seed"] == "42").all()
    # and the eval runs of both experiments share their keys
    evals = [r for r in _runs(ws) if r.info.run_name.startswith("eval@") and r.info.status == "FINISHED"]
    assert len(evals) == 6 and len({frozenset(r.data.metrics) for r in evals}) == 1


def test_compare_cli(workspace, monkeypatch):
    ws, run = workspace
    monkeypatch.chdir(ws)  # `rung compare` in this process: its store and params are the workspace's
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    def compare(*args: str):
        res = CliRunner().invoke(app, ["compare", *args])
        res.returncode = res.exit_code
        return res

    res = compare("--keys", "test/accuracy", "--all", "--last", "3")
    assert res.returncode == 0, res.stderr
    assert "eval@base" in res.stdout and "eval@rl-main" in res.stdout and "accuracy" in res.stdout
    res = compare("--parents", "--last", "3", "--keys", "eval/sft/test/accuracy", "--all")
    assert res.returncode == 0, res.stderr
    assert "eval/sft/test/accuracy" in res.stdout and "pipeline " in res.stdout and "repro " in res.stdout
    res = compare("--name", "report", "--last", "1", "--keys", "paired/rl-main-vs-sft/test/*")
    assert res.returncode == 0, res.stderr
    assert "mcnemar_p" in res.stdout and "wrong_to_right" in res.stdout and "significant" in res.stdout
    res = compare("--dvc", "--keys", "*comparisons.json:*rl-main-vs-sft.sets.test.mcnemar_p", "--all")
    assert res.returncode == 0 and "mcnemar_p" in res.stdout, res.stderr
    res = compare("--dvc", "--keys", "*eval-sft.json:sets.test.accuracy", "--all")
    assert res.returncode == 0, res.stderr
    assert "workspace" in res.stdout and "sets.test.accuracy" in res.stdout
    # `make exps`: DVC's experiments table with the headline metrics and key params only (docs/orchestration.md)
    res = run("make", "-s", "exps", "ARGS=--csv")
    assert res.returncode == 0, res.stderr
    header = res.stdout.splitlines()[0].split(",")
    assert {
        "Experiment",
        "params.yaml:seed",  # a metrics file has a `seed` too, so DVC names the column by its file
        "rl.stages.main.learning_rate",
        *(f"eval/{c}/test/accuracy" for c in ("base", "sft", "rl-main")),
        "paired/rl-main-vs-sft/test/difference",
        "paired/rl-main-vs-sft/test/mcnemar_p",
    } <= set(header) and len(header) <= 16, header
    res = compare("no-such-run-id")
    assert res.returncode == 2 and res.stderr.startswith("error:") and len(res.stderr.strip().splitlines()) == 1


def test_mlflow_runs_table_shows_two_experiments_side_by_side(workspace, tmp_path):
    """What a person sees: MLflow's UI (a server on the workspace's store, in headless Chromium) opens
    the runs table's `rung` view on one row per experiment, with the headline metrics and the params
    that differ as columns."""
    if not Path(CHROMIUM).exists():
        pytest.skip("headless Chromium not installed (Debian package `chromium`)")
    ws, run = workspace
    # the two experiments the report closed (a parent of a partial repro has stage durations only)
    closed = "eval/base/test/accuracy"
    parents = [r for r in _runs(ws) if r.data.tags.get("rung.role") == "pipeline" and closed in r.data.metrics]
    assert len(parents) == 2
    port, log = free_port(), tmp_path / "mlflow.log"
    cmd = ["mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    server = serve([sys.executable, "-m", *cmd, "--backend-store-uri", f"sqlite:///{ws / 'mlflow.db'}"], run.env, log)
    try:
        wait_healthy(server, f"http://127.0.0.1:{port}/health", log)
        experiment = mlflow.get_experiment_by_name("rung").experiment_id
        url = f"http://127.0.0.1:{port}/#/experiments/{experiment}/runs?viewStateShareKey=rung"
        # the page fetches its runs after it loads: Chromium's virtual time lets it finish first
        wait = ["--virtual-time-budget=30000", "--window-size=2400,800"]
        png = tmp_path / "runs.png"
        dom = chromium(tmp_path, *wait, "--dump-dom", f"--screenshot={png}", url).stdout
    finally:
        server.terminate()
        server.wait(timeout=30)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)))
    for name in [r.info.run_name for r in parents] + [
        "eval/base/test/accuracy",
        "eval/rl-main/test/pass_at_3",
        "paired/rl-main-vs-sft/test/mcnemar_p",
        "eval.sampling.max_new_tokens",
    ]:
        assert name in text, name
    assert png.stat().st_size > 10_000


def test_bad_params_fail_fast_and_keep_outputs(workspace):
    ws, run = workspace
    report = (ws / "data/reports/report.md").read_text()
    params = yaml.safe_load((ws / "params.yaml").read_text())
    params["rl"]["stages"]["main"]["learning_rate"] = "fast"
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (["rung", "validate"], [sys.executable, "-m", "flows.pipeline"], [sys.executable, "-m", "flows.report"]):
        res = run(*cmd)
        assert res.returncode == 2, cmd
        assert (
            res.stderr.strip().splitlines()[-1] == "error: params.yaml: rl.stages.main.learning_rate: "
            "Input should be a valid number, unable to parse string as a number"
        )
    assert (ws / "data/reports/report.md").read_text() == report


def _snapshot(ws: Path, *paths: str) -> dict[str, bytes]:
    return {
        str(f.relative_to(ws)): f.read_bytes()
        for p in paths
        for f in sorted([ws / p, *(ws / p).rglob("*")])
        if f.is_file()
    }


def test_a_failed_stage_under_plain_dvc_repro_is_one_checkout_from_its_outputs(workspace):
    ws, run = workspace
    outputs = ("data/curated", "data/plots/curate", "data/metrics/curate.json")
    before = _snapshot(ws, *outputs)
    params = tiny_params(Path(yaml.safe_load((ws / "params.yaml").read_text())["model"]["source"]))
    params["curate"]["sources"][1]["task"] = "no_such_task"
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    res = run("dvc", "repro", "curate")  # not `make`: DVC alone decides what happens to the outputs
    assert res.returncode != 0
    assert "error: curate.sources.chain_sum.task: unknown reasoning-gym task 'no_such_task'" in res.stderr
    # the stage's preflight refused the input before its MLflow run started
    assert not [r for r in _runs(ws) if r.info.run_name == "curate" and r.info.status in ("FAILED", "RUNNING")]
    # DVC removed the outputs before the stage ran (they are not persisted); the documented command restores
    # those of the last successful run (dvc.lock) from the cache, byte for byte
    assert _snapshot(ws, *outputs) != before
    res = run("dvc", "checkout", "curate")
    assert res.returncode == 0, res.stderr
    assert _snapshot(ws, *outputs) == before and len(before) >= 6


@pytest.mark.parametrize("stage, work, section", [("sft", "sft", "sft"), ("rl@main", "rl/main", "rl")])
def test_killed_stage_resumes_from_its_last_checkpoint(workspace, prefect_server, stage, work, section):
    ws, run = workspace
    params = tiny_params(Path(yaml.safe_load((ws / "params.yaml").read_text())["model"]["source"]))
    target = params["sft"] if section == "sft" else params["rl"]["stages"]["main"]
    target.update(max_steps=30, save_steps=2)  # long enough to be killed mid-run on a fast machine
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, **prefect_server, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("MLFLOW_TRACKING_URI", None)
    job = subprocess.Popen(
        ["dvc", "repro", stage],
        cwd=ws,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 300
    complete = (
        (CURRICULUM_STATE, "trainer_state.json") if section == "rl" else ("trainer_state.json",)
    )  # as rung.train.checkpoints.resume_point reads them
    while not complete_checkpoints(ws / "data/work" / work, complete):
        assert job.poll() is None and time.time() < deadline, "the stage ended before its first checkpoint"
        time.sleep(0.05)
    os.killpg(job.pid, 9)  # the whole job at once, like a lost node (maybe mid-way through a checkpoint)
    job.wait()

    res = run("dvc", "repro", stage)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    resumed = re.search(rf"resuming from data/work/{work}/checkpoint-(\d+)", res.stdout + res.stderr)
    assert resumed, res.stdout[-3000:] + res.stderr[-3000:]
    assert not (ws / "data/work" / work).exists()  # scratch removed once the model is published
    # the rerun reopened the killed attempt's stage run and completed it: every step once, none left RUNNING
    assert "MLflow: reopening the stage run of the unfinished attempt" in res.stdout + res.stderr
    last = max((r for r in _runs(ws) if r.info.run_name == stage), key=lambda r: r.info.start_time)
    history = mlflow.MlflowClient().get_metric_history(last.info.run_id, "loss")
    assert last.info.status == "FINISHED" and sorted(m.step for m in history) == list(range(1, 31))
    runs = _runs(ws)
    assert not [r.info.run_name for r in runs if r.info.status in ("RUNNING", "KILLED") and r.info.run_name == stage]


def test_an_rl_stage_with_lora_runs_from_params_to_the_report(workspace):
    ws, run = workspace
    params = tiny_params(Path(yaml.safe_load((ws / "params.yaml").read_text())["model"]["source"]))
    # a reward with variance in every group of the tiny random model, so that the adapters get a gradient
    (ws / "varied_reward.py").write_text(
        "def even_tokens(completion_ids, **_):\n"
        "    return [sum(t % 2 == 0 for t in ids) / len(ids) for ids in completion_ids]\n"
    )
    params["rl"]["stages"]["main"].update(
        lora={"r": 4, "alpha": 8}, learning_rate=1e-4, rewards={"even": {"import": "varied_reward:even_tokens"}}
    )
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    res = run("dvc", "repro", "report")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    metrics = json.loads((ws / "data/metrics/rl-main.json").read_text())
    assert metrics["steps"] == 2 and 0 < metrics["weights_changed_share"] < 1  # the adapted layers alone moved
    assert not list((ws / "data/models/rl/main").glob("adapter_*"))  # merged: a plain model for eval
    assert json.loads((ws / "data/metrics/eval-rl-main.json").read_text())["sets"]["test"]["n"] > 0
    rl = [r for r in _runs(ws) if r.info.run_name == "rl@main" and r.data.params.get("rl.main.lora.r") == "4"]
    assert rl and rl[0].info.status == "FINISHED"
    assert "| rl/main |" in (ws / "data/reports/report.md").read_text()


def test_zero_rl_skips_sft_and_starts_from_base(workspace):
    ws, run = workspace
    params = tiny_params(Path(yaml.safe_load((ws / "params.yaml").read_text())["model"]["source"]))
    params["sft"]["enabled"] = False
    params["rl"]["stages"]["main"]["init"] = "base"
    (ws / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    res = run("dvc", "repro", "rl@main")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert json.loads((ws / "data/models/sft/rung.json").read_text())["skipped"] is True
    assert json.loads((ws / "data/metrics/sft.json").read_text()) == {"skipped": 1}
    assert json.loads((ws / "data/models/rl/main/rung.json").read_text())["init"] == "data/models/base"
    assert json.loads((ws / "data/metrics/rl-main.json").read_text())["steps"] == 2
