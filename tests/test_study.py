"""Seed studies: the definition and the aggregation over seeds (rung/report/study.py), the paired
tests between arms (rung.eval.arms.arms_test), the page (rung/report/studypage.py), and `rung study`
end to end: two arms x two seeds of the tiny model as DVC experiments in a temporary git + DVC repo,
against a Prefect server on loopback."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import mlflow
import numpy as np
import pytest
import yaml
from scipy.stats import ttest_rel

from rung import config
from rung.errors import InputError
from rung.eval import arms, paired
from rung.eval.results import StudyResult
from rung.report import study, studypage
from tests.records import greedy, study_run
from tests.test_pipeline import tiny_params
from tests.workspace import make_workspace


def _write(tmp_path, text: str):
    path = tmp_path / "study.yaml"
    path.write_text(text)
    return path


def test_definition_is_checked_and_gives_one_experiment_per_arm_and_seed(tmp_path):
    spec = study.load(
        _write(
            tmp_path,
            """
name: cur
seed_key: rl.stages.main.seed
seeds: [1, 2]
params: {rl.stages.main.max_steps: 4}
arms:
  uniform: {rl.stages.main.curriculum: {type: uniform}, rl.stages.main.dynamic_sampling: null}
  pools: {rl.stages.main.curriculum.type: pools}
""",
        )
    )
    todo = study.points(spec)
    assert list(todo) == ["cur-uniform-1", "cur-pools-1", "cur-uniform-2", "cur-pools-2"]
    # nested mappings are set key by key, as `dvc exp run -S` merges them
    assert todo["cur-uniform-2"] == {
        "arm": "uniform",
        "seed": 2,
        "point": {
            "rl.stages.main.max_steps": 4,
            "rl.stages.main.curriculum.type": "uniform",
            "rl.stages.main.dynamic_sampling": None,
            "rl.stages.main.seed": 2,
        },
    }
    for text, error in [
        ("name: x\nseeds: [1]\narms: {a: {}}\nfoo: 1", r"study.yaml: foo: unknown key$"),
        ("name: x\nseeds: [1, 1]\narms: {a: {}}", r"study.yaml: seeds: repeated seeds in \[1, 1\]$"),
        (
            "name: x\nseeds: [1]\narms: {a: {seed: 3}}",
            r"study.yaml: arms.a: sets seed, the seed key; the study sets it per seed$",
        ),
        ("name: x-y\nseeds: [1]\narms: {a: {}}", r"study.yaml: name: String should match pattern"),
        ("name: x\nseeds: []\narms: {a: {}}", r"study.yaml: seeds: List should have at least 1 item"),
    ]:
        with pytest.raises(InputError, match=error):
            study.load(_write(tmp_path, text))


def _design(spec: study.Study, **samples) -> list:
    """The study's experiments' params from the repository's params.yaml, eval.samples changed by `samples`."""
    base = yaml.safe_load(Path("params.yaml").read_text())
    return [
        config.parse(
            config.with_overrides(base, {**t["point"], **{f"eval.samples.{k}": v for k, v in samples.items()}}), e
        )
        for e, t in study.points(spec).items()
    ]


def test_a_design_that_cannot_reach_a_verdict_is_refused_before_compute():
    passk = study.load("bench/passk.yaml")
    study.check_design(passk, "bench/passk.yaml", _design(passk))  # as committed: it can
    # As first run: 8 prompts, 18 claim members; the sign-flip p is at least 2 / 2^8, 18 x that after Holm.
    with pytest.raises(InputError) as e:
        study.check_design(passk, "bench/passk.yaml", _design(passk, max_prompts=8))
    assert str(e.value) == (
        "bench/passk.yaml: claims: 18 members (claims x arms x eval sets) on 8 prompts (eval.samples.max_prompts): "
        "the smallest p after Holm is 0.141, not below 0.05, whatever the effect; 10 prompts can reach it "
        "(power needs more: docs/studies.md)"
    )
    study.check_design(passk, "bench/passk.yaml", _design(passk, max_prompts=10))  # 18 x 2 / 1024 = 0.035
    # Past 12 prompts the random flips' floor 1 / (1 + resamples) holds: 72 members need 1440 to reach 0.05.
    many = passk.model_copy(update={"claims": passk.claims * 4})
    with pytest.raises(InputError, match=r"0\.0719, .*; over 12 prompts, eval.bootstrap.resamples 1440 can reach it"):
        study.check_design(many, "x.yaml", _design(many, max_prompts=64))
    # Arms over one seed have no test over seeds: no verdict about the procedure.
    one = study.Study(name="x", seeds=[1], arms={"a": {}, "b": {}})
    with pytest.raises(InputError, match=r"^x.yaml: seeds: 1 seed gives the arms no test over seeds"):
        study.check_design(one, "x.yaml", [])


def test_one_seed_is_exactly_the_mcnemar_test():
    rng = np.random.default_rng(1)
    old = rng.random(80) < 0.4
    new = np.where(rng.random(80) < 0.3, ~old, old)
    r = arms.arms_test(
        {7: greedy(list(old), prefix="p")}, {7: greedy(list(new), prefix="p")}, 0.95, 20000, 0, "b vs a on test"
    )
    test = paired.mcnemar(list(old), list(new))
    assert (r.units_better, r.units_worse) == (test["wrong_to_right"], test["right_to_wrong"])
    # the sign-flip test of +-1 differences is the exact McNemar test (here by 20000 random flips)
    assert r.p == pytest.approx(test["mcnemar_p"], abs=0.01) and r.unit == "prompt" and r.procedure.p is None
    assert r.difference == pytest.approx(new.mean() - old.mean())


def test_a_prompt_is_one_unit_over_seeds_whether_or_not_the_seeds_share_it():
    # Two seeds on the same 40 prompts: the new arm gets 10 more right in seed 1 and 6 more in seed 2.
    base = [i % 2 == 0 for i in range(40)]
    wins = {1: range(1, 21, 2), 2: range(1, 13, 2)}
    new = {s: greedy([c or i in wins[s] for i, c in enumerate(base)], prefix="p") for s in (1, 2)}
    old = {s: greedy(base, prefix="p") for s in (1, 2)}
    r = arms.arms_test(old, new, 0.95, 1000, 0, "b vs a on test")
    assert (r.unit, r.units, r.units_better, r.units_worse) == (
        "prompt",
        40,
        10,
        0,
    )  # 6 prompts won in both seeds count once
    assert r.difference == pytest.approx(16 / 80) and r.per_seed_difference == {
        "1": pytest.approx(0.25),
        "2": pytest.approx(0.15),
    }
    assert (
        r.p == pytest.approx(2 * 0.5**10)  # 10 clusters moved, all one way: 2 of 2^10 sign patterns
        and r.verdict == "significant at 0.05 (sign-flip permutation, exact)"
        and "prompts_needed" not in r.dump()
    )
    # the procedure's verdict: the t-test over the two seeds' accuracies (one run per seed and arm)
    assert r.procedure.p == pytest.approx(ttest_rel([0.75, 0.65], [0.5, 0.5]).pvalue)
    assert not r.procedure.significant and r.procedure.verdict == "not significant at 0.05 (paired t-test over seeds)"
    assert r.ci_low > 0 and r == arms.arms_test(old, new, 0.95, 1000, 0, "b vs a on test")  # seeded

    # Other prompts in each seed (the seed changed the data): each prompt its own cluster of one row.
    old2 = {s: greedy(base, [f"s{s}p{i}" for i in range(40)]) for s in (1, 2)}
    new2 = {s: greedy([r["samples"][0]["correct"] for r in new[s]], [f"s{s}p{i}" for i in range(40)]) for s in (1, 2)}
    r2 = arms.arms_test(old2, new2, 0.95, 1000, 0, "b vs a on test")
    assert (r2.unit, r2.units, r2.rows, r2.units_better) == ("prompt", 80, 80, 16) and r2.difference == pytest.approx(
        0.2
    )

    with pytest.raises(
        InputError, match="^b vs a on test, seed 2: the two checkpoints were evaluated on different prompts"
    ):
        arms.arms_test(old, {1: new[1], 2: new[2][:-1]}, 0.95, 100, 0, "b vs a on test")


def test_aggregate_writes_the_study_page(tmp_path):
    spec = study.Study(name="t", seeds=[1, 2], arms={"a": {}, "b": {}})
    runs = [
        study_run("a", 1, 0.25, [True, False, False, False]),
        study_run("a", 2, 0.5, [True, True, False, False]),
        study_run("b", 1, 0.5, [True, True, False, False]),
        study_run("b", 2, 0.75, [True, True, True, False]),
    ]
    result = study.aggregate(spec, runs, 0.95, 200, 0)
    m = result.arms["a"].metrics
    assert m["test/accuracy"].dump() == {
        "mean": 0.375,
        "sd": pytest.approx(np.std([0.25, 0.5], ddof=1)),
        "values": [0.25, 0.5],
    }
    assert set(m) == {
        "test/accuracy",
        "test/format_rate",
        "test/mean_tokens",
        "test/truncation_rate",
        "test/avg@2",
        "test/pass@1",
        "test/pass@2",
        "rl/steps",
        "rl/reward_last",
        "rl/frac_reward_zero_std",
    }
    c = result.comparisons["b-vs-a"].sets["test"]
    assert (
        (c.units_better, c.units_worse, c.difference) == (2, 0, pytest.approx(0.25))
        and c.prompts_needed
        and c.prompts_needed > 4
    )
    curves = result.curves["a"]
    assert curves["reward"] == [(1.0, pytest.approx(0.15), 0.1, 0.2), (2.0, pytest.approx(0.3), 0.2, 0.4)]
    assert curves["held_out_accuracy"] == [(0.0, 0.25, 0.25, 0.25), (1.0, 0.625, 0.5, 0.75), (2.0, 0.375, 0.25, 0.5)]

    paths = studypage.write(result, {"seeds": "1, 2"}, tmp_path)
    md = paths["md"].read_text()
    assert (
        "| a | 2 | 37.5 ± 17.7 |" in md and "| b vs a | test | 2 | 4 prompts (8 rows) | 37.5% → 62.5% | +25.0 [" in md
    )
    assert "not significant at 0.05 (sign-flip permutation, exact); post-hoc: about" in md
    page = paths["html"].read_text()
    for fig in ("plot-held-out", "plot-reward", "plot-train-accuracy"):
        assert f'<figure id="{fig}"' in page
        assert "<svg" in (tmp_path / "t" / f"{fig}.svg").read_text()  # the curves as files too, for a README
    assert not any(tag in page for tag in ("<script", "<link", "src=", "<img"))  # self-contained
    written = json.loads(paths["json"].read_text())
    assert written.pop("settings") == {"seeds": "1, 2"} and StudyResult.model_validate(written) == result


STUDY = """
name: tiny
seed_key: rl.stages.main.seed
seeds: [1, 2]
arms:
  uniform: {rl.stages.main.curriculum: {type: uniform}, rl.stages.main.dynamic_sampling: null}
  pools: {rl.stages.main.curriculum: {type: pools}}
"""


def test_rung_study_runs_two_arms_by_two_seeds(tiny_model, prefect_server, tmp_path_factory):
    ws = tmp_path_factory.mktemp("ws")
    params = tiny_params(tiny_model)
    # RL from the base model (no SFT stages), greedy evaluation only: the smallest DAG with an RL stage.
    params["difficulty"]["reference"] = "base"
    params["rl"]["stages"]["main"]["init"] = "base"
    params["eval"]["samples"] = None
    env = {**os.environ, **prefect_server}
    env.pop("MLFLOW_TRACKING_URI", None)
    run = make_workspace(ws, params, env, stages=["model", "curate", "difficulty", "rl", "eval_base", "eval_rl"])
    res = run("dvc", "repro")  # the baseline: each experiment then reruns only rl@main and eval_rl@main
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    assert run("git", "add", "-A").returncode == 0 and run(*git, "commit", "-q", "-m", "baseline").returncode == 0

    tmp = tmp_path_factory.mktemp("defs")
    (tmp / "bad.yaml").write_text(STUDY.replace("{type: pools}", "{type: pools}, rl.stages.main.learning_rate: -1"))
    res = run("rung", "study", str(tmp / "bad.yaml"))
    assert res.returncode == 2 and res.stderr.strip().splitlines() == [
        "error: params.yaml with tiny-pools-1 {'rl.stages.main.curriculum.type': 'pools', "
        "'rl.stages.main.learning_rate': -1, "
        "'rl.stages.main.seed': 1}: rl.stages.main.learning_rate: Input should be greater than 0"
    ], res.stderr[-2000:]
    assert json.loads(run("dvc", "exp", "show", "--json").stdout)[0].get("experiments") is None  # nothing queued

    (tmp / "study.yaml").write_text(STUDY)
    res = run("rung", "study", str(tmp / "study.yaml"), "--jobs", "2")  # two DVC queue workers, as users run it
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = ws / "data/studies/tiny"
    result = json.loads((out / "study.json").read_text())
    assert set(result["arms"]) == {"uniform", "pools"} and all(a["seeds"] == [1, 2] for a in result["arms"].values())
    n_test = len((ws / "data/curated/test.jsonl").read_text().splitlines())
    for name in ("test", "ood_chain"):
        c = result["comparisons"]["pools-vs-uniform"]["sets"][name]
        assert (
            c["seeds"] == [1, 2] and c["unit"] == "prompt" and c["units"] == (n_test if name == "test" else 6)
        )  # RL seeds share the prompts
    curves = result["curves"]["pools"]
    assert [p[0] for p in curves["reward"]] == [1.0, 2.0] and [p[0] for p in curves["held_out_accuracy"]] == [0.0, 2.0]
    assert (
        "| uniform | 2 |" in (out / "study.md").read_text()
        and '<figure id="plot-reward"' in (out / "study.html").read_text()
    )

    # MLflow: the study's parent run holds the experiments' pipeline runs, whose RL stages ran with their own seeds.
    mlflow.set_tracking_uri(f"sqlite:///{ws / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["rung"], output_format="list")
    [parent] = [r for r in runs if r.data.tags.get("rung.role") == "study"]
    assert parent.data.metrics["study/uniform/test/accuracy/mean"] == pytest.approx(
        result["arms"]["uniform"]["metrics"]["test/accuracy"]["mean"]
    )
    exps = {r.data.tags["dvc.exp_name"]: r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id}
    assert set(exps) == {"tiny-uniform-1", "tiny-pools-1", "tiny-uniform-2", "tiny-pools-2"}
    rl_seeds = {
        r.data.tags["dvc.exp_name"]: r.data.params["seed"]
        for r in runs
        if r.info.run_name == "rl@main" and "dvc.exp_name" in r.data.tags
    }
    assert (
        rl_seeds["tiny-pools-1"] == rl_seeds["tiny-uniform-1"] != rl_seeds["tiny-pools-2"] == rl_seeds["tiny-uniform-2"]
    )

    # Run again: every experiment is done for this commit, so only the page is written again.
    res = run("rung", "study", str(tmp / "study.yaml"))
    assert res.returncode == 0 and "4 experiment(s) already done" in res.stdout + res.stderr, res.stderr[-2000:]
    assert json.loads((out / "study.json").read_text())["arms"] == result["arms"]

    # A later commit (new statistics code, say): --aggregate-only reads the experiments at the commit they
    # ran at and trains nothing; the page says both commits.
    ran_at = run("git", "rev-parse", "HEAD").stdout.strip()
    (ws / "NOTE").write_text("later\n")
    assert run("git", "add", "NOTE").returncode == 0 and run(*git, "commit", "-q", "-m", "later").returncode == 0
    res = run("rung", "study", str(tmp / "study.yaml"), "--aggregate-only")
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    again = json.loads((out / "study.json").read_text())
    assert again["arms"] == result["arms"] and again["settings"]["experiments ran at commit"] == ran_at[:12]
    assert again["settings"]["git commit"] != ran_at[:12] and "dvc exp run" not in res.stdout + res.stderr


def test_aggregate_only_finds_each_experiment_wherever_it_ran(tmp_path, monkeypatch):
    from flows import study as flows_study

    monkeypatch.chdir(tmp_path)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    run = lambda *a: subprocess.run([*a], check=True, capture_output=True, text=True).stdout.strip()  # noqa: E731
    run("git", "init", "-q")
    commits = []
    for i in range(2):
        (tmp_path / "f").write_text(str(i))
        run("git", "add", "f")
        run(*git, "commit", "-q", "-m", str(i))
        commits.append(run("git", "rev-parse", "HEAD"))
    exp = lambda base, name: f"refs/exps/{base[:2]}/{base[2:]}/{name}"  # noqa: E731  (DVC's ExpRefInfo layout)
    run("git", "update-ref", exp(commits[0], "s-a-1"), commits[0])  # ran at the first commit only
    run("git", "update-ref", exp(commits[0], "s-a-2"), commits[0])  # ran at both
    run("git", "update-ref", exp(commits[1], "s-a-2"), commits[1])
    found = flows_study.locate(["s-a-1", "s-a-2"])
    assert found == {"s-a-1": (exp(commits[0], "s-a-1"), commits[0]), "s-a-2": (exp(commits[1], "s-a-2"), commits[1])}
    assert flows_study.locate(["s-a-2"], commits[0][:7])["s-a-2"][1] == commits[0]  # the commit asked for
    with pytest.raises(InputError, match="^experiment s-a-3: no run.* \\(it ran at: none\\)"):
        flows_study.locate(["s-a-3"])
    with pytest.raises(InputError, match=f"experiment s-a-1: no run.*it ran at: {commits[0][:12]}"):
        flows_study.locate(["s-a-1"], commits[1])
