"""Where a run's time goes: each stage's wall time recorded when its flow ends (data/timings/ and
MLflow), and the table of a run's stages: ran or failed with seconds and shares, cached when not rerun."""

from __future__ import annotations

import gc
from pathlib import Path

import mlflow
import psutil
import pytest
from dvc.repo import Repo
from typer.testing import CliRunner

from flows import stage as flow_stage
from flows.cli import app
from rung import config, files, paths, tracking
from rung.report import keys, timings
from tests.conftest import ROOT
from tests.test_tracking import _git_repo


def _earlier_run(root: Path, stage: str, seconds: float) -> None:
    """A record of `stage` from a run before the current one (its process long gone)."""
    files.write_json(
        root / paths.TIMINGS / f"{stage}.json",
        {"stage": stage, "started": 0.0, "seconds": seconds, "status": "ran", "run": "1-0.000"},
    )


def test_the_table_shows_this_runs_stages_and_the_cached_ones(tmp_path):
    timings.begin(tmp_path)  # this process began the run
    start = psutil.Process().create_time()
    timings.record("model", "ran", start + 1, 30.0, None, tmp_path)
    _earlier_run(tmp_path, "curate", 55.0)  # restored from DVC's cache in this run: not rerun
    timings.record("sft", "ran", start + 40, 80.0, None, tmp_path)
    timings.record("rl@main", "failed", start + 130, 10.0, None, tmp_path)
    order = ["model", "curate", "sft", "rl@main", "report"]  # report: never ran here

    s = timings.summary(order, tmp_path)
    assert s.rows == [
        ("model", "ran", 30.0),
        ("curate", "cached", None),
        ("sft", "ran", 80.0),
        ("rl@main", "failed", 10.0),
        ("report", "cached", None),
    ]
    assert (s.started, s.ended) == (start, start + 140)
    assert s.peak is not None and s.peak > 1  # GFLOP/s of this machine's fp32 matmul, measured as the run began
    text = timings.markdown(order, tmp_path)
    assert "## Wall time per stage" in text
    assert f"This machine's fp32 matmul peak read {s.peak:.0f} GFLOP/s as the run began" in text
    assert "140.0 s from its start to its last stage's end, 120.0 s of them in the stages" in text
    for row in (
        "| stage | status | wall time | share |",
        "| model | ran | 30.0 s | 25% |",
        "| curate | cached |  |  |",
        "| sft | ran | 80.0 s | 67% |",
        "| rl@main | failed | 10.0 s | 8% |",
        "| report | cached |  |  |",
        "| all stages |  | 120.0 s |  |",
    ):
        assert row in text.splitlines()

    timings.begin(tmp_path, psutil.Process().parent())  # another run, which reran nothing: every stage cached
    again = timings.markdown(order, tmp_path)
    assert "Nothing ran: every stage was cached." in again and "| model | cached |  |  |" in again


def test_a_plain_dvc_repro_is_marked_by_its_first_stage(tmp_path):
    """No run marked by one of its ancestors (the marker is an earlier run's): the first stage marks the
    run of its dvc process, and the next stage of the same process joins it."""
    _earlier_run(tmp_path, "curate", 5.0)
    files.write_json(tmp_path / timings.RUN, {"run": "1-0.000", "started": 0.0})
    dvc = psutil.Process().parent()  # stands in for the `dvc repro` that started this stage
    first = timings.record("model", "ran", dvc.create_time() + 1, 2.0, dvc, tmp_path)
    second = timings.record("curate", "ran", dvc.create_time() + 3, 4.0, dvc, tmp_path)
    assert first.run == second.run == files.read_json(tmp_path / timings.RUN)["run"] != "1-0.000"
    assert timings.summary(["model", "curate"], tmp_path).started == dvc.create_time()
    assert timings.summary(["model", "curate"], tmp_path).rows == [("model", "ran", 2.0), ("curate", "ran", 4.0)]


def test_a_run_begun_inside_another_is_part_of_it(tmp_path):
    """The pipeline flow under `make pipeline`'s flows.with_server: the outer run stays the run."""
    outer = psutil.Process().parent()
    timings.begin(tmp_path, outer)
    timings.begin(tmp_path)  # this process, started by `outer`
    assert files.read_json(tmp_path / timings.RUN)["started"] == outer.create_time()


def test_no_table_where_no_run_was_recorded(tmp_path):
    assert timings.markdown(["model"], tmp_path) == ""


def test_rung_table_prints_the_results_then_the_stage_times(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Repo.init(tmp_path, no_scm=True)
    (tmp_path / "dvc.yaml").write_text(
        "stages:\n"
        "  second:\n    cmd: cp a.txt b.txt\n    deps: [a.txt]\n    outs: [b.txt]\n"
        "  first:\n    cmd: echo 1 > a.txt\n    outs: [a.txt]\n"
    )
    (tmp_path / paths.REPORT).parent.mkdir(parents=True)
    (tmp_path / paths.REPORT).write_text("# rung results\n")
    timings.begin(tmp_path)
    timings.record("second", "ran", psutil.Process().create_time(), 3.0, None, tmp_path)
    _earlier_run(tmp_path, "first", 5.0)

    res = CliRunner().invoke(app, ["table", str(tmp_path / paths.REPORT)])
    assert res.exit_code == 0, res.output
    out = res.output
    assert out.index("rung results") < out.index("Wall time per stage") < out.index("first") < out.index("second")
    assert [line.split() for line in out.splitlines() if line.strip().startswith(("first", "second"))] == [
        ["first", "cached"],
        ["second", "ran", "3.0", "s", "100%"],
    ]


def _stage(fail: bool) -> None:
    """A stage's flow: its MLflow stage run, and a failure inside it when asked."""
    with tracking.stage_run("rl@main", config.load(paths.PARAMS), logged={}, inputs={}):
        if fail:
            raise RuntimeError("the stage failed")


def test_a_stage_records_its_wall_time_in_the_run_table_and_mlflow(tmp_path, monkeypatch):
    """flows.stage.main: the record in data/timings/ (the run's table) and, for a stage that ran to the
    end, `stage/duration_s` on its MLflow run and `duration_s/<stage>` on the parent, in a sqlite store."""
    _git_repo(tmp_path, (ROOT / "params.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DVC_STAGE", "rl@main")
    for var in (tracking.PARENT_ENV, "DVC_EXP_NAME", "DVC_ROOT"):
        monkeypatch.delenv(var, raising=False)
    timings.begin()
    try:
        flow_stage.main(_stage, False)
    finally:
        gc.unfreeze()  # main freezes the objects of a process about to end; this one goes on
    record = files.read_json(paths.TIMINGS / "rl@main.json")
    assert record["status"] == "ran" and record["run"] == files.read_json(timings.RUN)["run"]

    [run] = mlflow.search_runs(
        experiment_names=["rung"], filter_string="tags.`rung.role` = 'stage'", output_format="list"
    )
    seconds = run.data.metrics[keys.STAGE_DURATION]
    assert seconds == pytest.approx(record["seconds"], abs=1.0) and seconds > 0
    parent = mlflow.get_run(run.data.tags["mlflow.parentRunId"])
    assert parent.data.metrics["duration_s/rl_at_main"] == seconds

    with pytest.raises(RuntimeError, match="the stage failed"):
        flow_stage.main(_stage, True)
    assert files.read_json(paths.TIMINGS / "rl@main.json")["status"] == "failed"
    stages = mlflow.search_runs(
        experiment_names=["rung"], filter_string="tags.`rung.role` = 'stage'", output_format="list"
    )
    failed = [r for r in stages if r.info.status == "FAILED"]
    assert len(failed) == 1 and keys.STAGE_DURATION not in failed[0].data.metrics
