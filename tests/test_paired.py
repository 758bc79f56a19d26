"""Paired tests of checkpoints (rung.eval.paired), the report's comparisons (rung.eval.comparisons)
and their place in the report, and how MLflow names and marks the runs."""

from __future__ import annotations

import json
import math
import subprocess

import mlflow
import numpy as np
import pytest

from rung import config, files, tracking
from rung.errors import InputError
from rung.eval import arms, comparisons, paired
from rung.eval.results import Comparisons, EvalResult
from rung.report import htmlpage, pipeline, tables
from tests.records import greedy, sampled, write_evaluated


def test_exact_mcnemar_on_the_issue_numbers():
    # 12 prompts turn right, 5 turn wrong (issue #18): two-sided exact p = 2 * P(X <= 5), X ~ Bin(17, 1/2)
    old = [False] * 12 + [True] * 5 + [True] * 40 + [False] * 38
    new = [True] * 12 + [False] * 5 + [True] * 40 + [False] * 38
    t = paired.mcnemar(old, new)
    expected = 2 * sum(math.comb(17, i) for i in range(6)) / 2**17  # 9402 / 65536 = 0.1435
    assert t == {
        "right_to_wrong": 5,
        "wrong_to_right": 12,
        "both_right": 40,
        "both_wrong": 38,
        "mcnemar_p": pytest.approx(expected),
    }
    assert round(t["mcnemar_p"], 2) == 0.14


@pytest.mark.parametrize("flips, p", [(0, 1.0), (5, 2 / 2**5), (6, 2 / 2**6)])
def test_mcnemar_one_sided_flips(flips, p):
    old = [False] * flips + [True] * 10
    new = [True] * flips + [True] * 10
    assert paired.mcnemar(old, new)["mcnemar_p"] == pytest.approx(p)


def test_verdict_follows_mcnemar_at_the_level_of_the_confidence():
    six = paired.greedy_test(greedy([False] * 6 + [True] * 4), greedy([True] * 10), 0.95, "x")
    five = paired.greedy_test(greedy([False] * 5 + [True] * 5), greedy([True] * 10), 0.95, "x")
    assert (six.mcnemar_p, six.significant, six.verdict) == (
        pytest.approx(0.03125),
        True,
        "significant at 0.05 (exact McNemar)",
    )
    assert (five.mcnemar_p, five.significant, five.verdict) == (
        pytest.approx(0.0625),
        False,
        "not significant at 0.05 (exact McNemar)",
    )
    assert five.difference == pytest.approx(0.5) and five.accuracy_old == 0.5 and five.accuracy_new == 1.0
    assert (
        paired.greedy_test(greedy([False] * 5 + [True] * 5), greedy([True] * 10), 0.9, "x").verdict
        == "significant at 0.1 (exact McNemar)"
    )
    assert (
        "prompts_needed" not in six.dump() and five.dump()["prompts_needed"] == 15
    )  # on disk only when not significant


def _exact_power(right_to_wrong: int, wrong_to_right: int, n_observed: int, n: int, alpha: float = 0.05) -> float:
    """Power of the exact McNemar test on n prompts when the flip rates are the observed ones, by
    enumerating the discordant count d and the split x of the discordant prompts (the exact test's
    two-sided p under Binomial(d, 1/2), symmetric: twice the tail of min(x, d - x))."""
    from scipy.stats import binom

    psi = (right_to_wrong + wrong_to_right) / n_observed
    up = wrong_to_right / (right_to_wrong + wrong_to_right)
    power = 0.0
    for d in range(1, n + 1):
        x = np.arange(d + 1)
        rejects = np.minimum(1.0, 2 * binom.cdf(np.minimum(x, d - x), d, 0.5)) < alpha
        power += binom.pmf(d, n, psi) * binom.pmf(x[rejects], d, up).sum()
    return power


def test_prompts_needed_for_80_percent_power():
    # The example of docs/evaluation.md (How rung compares checkpoints): 12 wrong -> right, 5 right -> wrong
    # on 95 prompts, p = 0.14.
    n = paired.mcnemar_prompts_needed(5, 12, 95)
    assert n == 273 == paired.mcnemar_prompts_needed(12, 5, 95)  # the direction does not matter
    # Connor's formula (257) is a normal approximation, a little short for the exact test (77%): from there the
    # prompts step up to the first size whose exact power, checked here by enumeration, reaches 80%
    assert _exact_power(5, 12, 95, 257) < 0.78 and _exact_power(5, 12, 95, n - 1) < 0.8 <= _exact_power(5, 12, 95, n)
    assert paired.mcnemar_power(n, 5 / 95, 12 / 95, 0.05) == pytest.approx(_exact_power(5, 12, 95, n))
    assert _exact_power(5, 12, 95, n // 2) < 0.5
    assert paired.mcnemar_prompts_needed(5, 12, 95, power=0.9) > n > paired.mcnemar_prompts_needed(5, 20, 95)
    assert paired.mcnemar_prompts_needed(4, 4, 95) is None and paired.mcnemar_prompts_needed(0, 0, 95) is None
    with pytest.raises(ValueError, match="do not fit"):
        paired.mcnemar_prompts_needed(50, 50, 95)
    five = paired.greedy_test(greedy([False] * 5 + [True] * 5), greedy([True] * 10), 0.95, "x")
    assert (
        tables.verdict(five.model_copy(update={"prompts_needed": 273}))
        == "not significant at 0.05 (exact McNemar); post-hoc: about 273 prompts at this effect"
    )
    assert (
        tables.verdict(five.model_copy(update={"significant": True, "verdict": "significant at 0.05 (exact McNemar)"}))
        == "significant at 0.05 (exact McNemar)"
    )


def test_mcnemar_interval_is_bonett_price_and_narrower_than_unpaired():
    # Bonett and Price (2012), by hand: 3 right -> wrong, 9 wrong -> right of 40: (4/42, 10/42)
    diff, lo, hi = paired.mcnemar_interval(3, 9, 40, 0.95)
    half = 1.959964 * math.sqrt((14 / 42 - (6 / 42) ** 2) / 42)
    assert diff == 6 / 40 and (lo, hi) == pytest.approx((6 / 42 - half, 6 / 42 + half), abs=1e-6)
    rng = np.random.default_rng(1)
    old = rng.random(400) < 0.45
    new = np.where(rng.random(400) < 0.2, ~old, old)  # 20% of prompts flip, either way
    flips = paired.mcnemar(old, new)
    diff, lo, hi = paired.mcnemar_interval(flips["right_to_wrong"], flips["wrong_to_right"], 400)
    assert diff == pytest.approx(new.mean() - old.mean()) and lo < diff < hi
    # the paired interval is narrower than the one from two independent samples would be
    se_unpaired = math.sqrt(old.mean() * (1 - old.mean()) / 400 + new.mean() * (1 - new.mean()) / 400)
    assert hi - lo < 2 * 1.96 * se_unpaired
    with pytest.raises(ValueError, match="do not fit"):
        paired.mcnemar_interval(5, 6, 10)


def test_an_interval_stays_inside_what_the_metric_can_take():
    """49 of 50 prompts gained, 1 unchanged (the tools recipe's avg@4 over base): the widened interval reached
    +101.2 points; a difference of shares is cut to -1..1, a share to 0..1, and both still hold the estimate."""
    diff, lo, hi = paired.mcnemar_interval(0, 49, 50)
    assert lo < diff == 0.98 and hi == 1.0
    est, low, high = paired.intervals(np.array([[1.0] * 49 + [0.0]]), np.ones(50), 0.95, 1000, 0, bounds=(0.0, 1.0))
    assert low[0] < est[0] == 0.98 and high[0] == 1.0


def test_a_prompt_answered_by_several_seeds_is_one_cluster():
    # seed 1 answers a, b; seed 2 answers a, c: a is one cluster of two rows
    clusters = arms.unit_values({1: {"a": 1.0, "b": 0.0}, 2: {"a": 1.0, "c": 1.0}})
    assert [list(x) for x in clusters] == [[2.0, 0.0, 1.0], [2.0, 1.0, 1.0]]
    # two prompts, three rows each, every row of a prompt alike: resampled as clusters the interval spans
    # what two units allow (here, all of [0, 1]); as six independent rows it would be far narrower
    sums, sizes = np.array([[3.0, 0.0]]), np.array([3.0, 3.0])
    est, lo, hi = paired.intervals(sums, sizes, 0.95, 500, 0)
    assert est[0] == 0.5 and lo[0] <= 0 and hi[0] >= 1
    _, lo6, hi6 = paired.intervals(np.array([[1.0, 1, 1, 0, 0, 0]]), np.ones(6), 0.95, 500, 0)
    assert hi6[0] - lo6[0] < hi[0] - lo[0]


def test_sign_flip_test_is_exact_and_max_t_over_a_family():
    # d = 1, 2, 3: of the 8 sign patterns only all + and all - reach |sum| = 6
    p, exact = paired.flip_test(np.array([[1.0, 2.0, 3.0]]), 1000, 0)
    assert exact and p[0] == pytest.approx(2 / 8)
    # one prompt with a difference: the two-sided exact McNemar on one discordant prompt, p = 1
    assert paired.flip_test(np.array([[0.0, 1.0, 0.0]]), 1000, 0)[0][0] == 1.0
    # a family: each metric's p is at least its own test's (max-T), and a metric without spread has p 1
    family, _ = paired.flip_test(np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0], [3.0, -1.0, 2.0]]), 1000, 0)
    assert family[0] >= p[0] and family[1] == 1.0
    # random flips above ENUMERATE prompts: p = (1 + hits) / (1 + flips), never 0
    many, exact = paired.flip_test(np.ones((1, paired.ENUMERATE + 1)), 999, 0)
    assert not exact and many[0] == pytest.approx(1 / 1000, abs=2 / 1000)


def test_holm_adjusts_a_family_step_down():
    assert paired.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert paired.holm_factor([0.01, 0.04, 0.03]) == [3, 1, 2]


def test_records_pair_by_id_and_refuse_different_prompts():
    old = greedy([True, False, False], ids=["a", "b", "c"])
    new = greedy([False, True, True], ids=["c", "b", "a"])  # same prompts, another order
    g = paired.greedy_test(old, new, 0.95, "new vs old on test")
    assert (g.right_to_wrong, g.wrong_to_right, g.both_right, g.both_wrong) == (0, 1, 1, 1)
    with pytest.raises(
        InputError,
        match=r"^sft vs base on test: the two checkpoints were evaluated on different prompts "
        r"\(1 ids only in the first, 1 only in the second, e.g. 'c'\)",
    ):
        paired.greedy_test(old, greedy([True, True, True], ids=["a", "b", "d"]), 0.95, "sft vs base on test")
    with pytest.raises(InputError, match="duplicate prompt ids"):
        paired.align(old, greedy([True, True, True], ids=["a", "a", "b"]), "x")


def test_sampled_comparison_of_avg_and_pass_at_k():
    old = sampled([0, 0, 2, 4], n=4)  # avg@4 = 6/16; pass@4 = 2/4
    new = sampled([1, 2, 4, 4], n=4)  # avg@4 = 11/16; pass@4 = 1
    s = paired.sampled_test(old, new, 0.95, 500, 0, "x")
    assert s.samples == 4 and s.n == 4 and s.family == ["avg@4", "pass@1", "pass@2", "pass@4"]
    assert set(s.dump()) == {"n", "samples", "family", "test", "boundary", "avg@4", "pass@1", "pass@2", "pass@4"}
    # flat on disk; pass@k at the spectrum's k
    b = s.boundary  # coverage: solved at least once in 4; the first two prompts only new solves
    assert (b.coverage_old, b.coverage_new, b.solved_only_old) == (0.5, 1.0, [])
    assert b.solved_only_new == [old[0]["id"], old[1]["id"]] and b.mcnemar_p == pytest.approx(0.5)  # 2 of 2 flips
    m = s.metrics
    assert m["avg@4"].old == pytest.approx(6 / 16) and m["avg@4"].difference == pytest.approx(5 / 16)
    assert m["pass@1"].difference == pytest.approx(m["avg@4"].difference)  # pass@1 is avg@n
    assert m["pass@4"].old == 0.5 and m["pass@4"].new == 1.0
    # every prompt improves or stays, but with 4 prompts no exact test reaches 0.05 (16 sign patterns, and
    # the family's max-T): the verdict says so and names its test
    assert m["avg@4"].p >= 2 / 16 and m["avg@4"].verdict == "not significant at 0.05 (sign-flip permutation, exact)"
    twelve = paired.sampled_test(sampled([0, 1] * 6, n=4), sampled([2, 3] * 6, n=4), 0.95, 500, 0, "x").metrics
    assert twelve["avg@4"].p == pytest.approx(2 / 4096) and twelve["avg@4"].significant  # all 12 improve
    assert type(s).model_validate(s.dump()) == s


def test_pairs_compare_each_checkpoint_with_its_init_and_rl_with_base():
    assert comparisons.pairs({"main": "sft"}) == [("sft", "base"), ("rl/main", "sft"), ("rl/main", "base")]
    assert comparisons.pairs({"zero": "base", "more": "rl/zero"}) == [
        ("sft", "base"),
        ("rl/zero", "base"),
        ("rl/more", "rl/zero"),
        ("rl/more", "base"),
    ]


@pytest.fixture
def evaluated(tmp_path, monkeypatch):
    """data/eval records of base, sft and rl/main in a temporary workspace."""
    monkeypatch.chdir(tmp_path)
    write_evaluated(tmp_path, "ood")
    return tmp_path


def test_report_writes_the_comparisons_in_words(evaluated):
    compared = comparisons.comparisons(comparisons.pairs({"main": "sft"}), 0.95, 1000, 42)
    assert list(compared.comparisons) == ["sft-vs-base", "rl-main-vs-sft", "rl-main-vs-base"]
    c = compared.comparisons["rl-main-vs-sft"]
    assert (c.new, c.old, list(c.sets)) == ("rl/main", "sft", ["test", "ood"])
    test = c.sets["test"]
    assert (test.wrong_to_right, test.right_to_wrong) == (12, 5)
    assert test.verdict == "not significant at 0.05 (exact McNemar)"
    assert test.prompts_needed == 172  # not significant: the prompts it would need (mcnemar_prompts_needed)
    assert (
        test.ci_low < test.difference < test.ci_high
        and test.sampled
        and set(test.sampled.metrics) >= {"avg@3", "pass@3"}
    )
    assert "sampled" not in c.sets["ood"].dump()
    assert comparisons.comparisons(comparisons.pairs({"main": "sft"}), 0.95, 1000, 42) == compared  # seeded

    evals = {
        c: EvalResult.model_validate(
            {
                "sets": {
                    "test": {
                        "n": 60,
                        "accuracy": 0.3,
                        "accuracy_ci": [0.2, 0.4],
                        "accuracy_lenient": 0.3,
                        "format_rate": 1.0,
                        "mean_tokens": 9.0,
                        "truncation_rate": 0.0,
                        "accuracy_by_source": {},
                    }
                },
                "sampling": {"temperature": 0.0},
                "bootstrap": {"confidence": 0.95},
            }
        )
        for c in ("base", "sft", "rl/main")
    }
    text = pipeline.run(evals, {"rl/main": [{"step": 1, "reward": 0.5}]}, {}, {"seed": 42}, compared)
    assert Comparisons.model_validate_json(pipeline.COMPARISONS.read_text()) == compared
    assert "## Paired comparisons" in text and "not significant at 0.05" in text
    row = next(line for line in text.splitlines() if line.startswith("| rl/main vs sft | test |"))
    p = f"{test.mcnemar_p:.2f}"
    signed = lambda v: f"{100 * v:+.1f}".replace("-", "−")  # noqa: E731
    assert (
        f"| 60 | {100 * test.accuracy_old:.1f}% → {100 * test.accuracy_new:.1f}% | "
        f"+11.7 [{signed(test.ci_low)}, {signed(test.ci_high)}] |" in row
    )
    assert row.endswith(
        f"| 5 | 12 | {p} | not significant at 0.05 (exact McNemar); post-hoc: about 172 prompts at this effect |"
    )
    assert "| rl/main vs sft | test | 10 | pass@3 |" in text
    page = (evaluated / "data/reports/report.html").read_text()
    assert '<table id="paired">' in page and '<table id="paired-sampled">' in page
    assert (
        "<td>not significant at 0.05 (exact McNemar); post-hoc: about 172 prompts at this effect</td>" in page
        and "<th>exact McNemar p</th>" in page
    )


def test_report_refuses_checkpoints_evaluated_on_different_prompts(evaluated):
    files.write_jsonl(evaluated / "data/eval/sft/test.jsonl", greedy([True] * 59))
    with pytest.raises(
        InputError, match="^sft vs base on test: the two checkpoints were evaluated on different prompts"
    ):
        comparisons.comparisons([("sft", "base")], 0.95, 100, 0)


def test_extra_tables_escape_and_align():
    page = htmlpage.render(
        {"base": {"accuracy": 0.1, "format_rate": 1, "mean_tokens": 3, "truncation_rate": 0, "n": 4}},
        extra=[htmlpage.Extra("t", "cap", ["a", "b"], [["<x>", "−1.0 [−2, 0]"], ["x", "< 0.001"]], ["a & b"])],
    )
    assert (
        '<tr><td>&lt;x&gt;</td><td class="num">−1.0 [−2, 0]</td></tr>' in page
        and '<td class="num">&lt; 0.001</td>' in page
        and '<p class="note">a &amp; b</p>' in page
    )


@pytest.fixture
def store(tmp_path, monkeypatch, default_params):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    for var in ("DVC_EXP_NAME", tracking.PARENT_ENV, "DVC_ROOT"):
        monkeypatch.delenv(var, raising=False)
    return config.parse(default_params)


def _git(*args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], check=True, capture_output=True)


def test_experiment_opens_on_training_runs(store):
    experiment_id = tracking.setup(store)
    assert mlflow.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "finetuning"
    mlflow.MlflowClient().set_experiment_tag(experiment_id, "mlflow.experimentKind", "custom_model_development")
    tracking.setup(store)  # a kind the user chose stays
    assert mlflow.get_experiment(experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"


def test_parent_runs_are_named_for_what_they_ran(store, tmp_path, monkeypatch, default_params):
    assert tracking.start_parent(store, invocation="pipeline").info.run_name == "pipeline"  # no git here
    _git("init", "-q")
    (tmp_path / "params.yaml").write_text(json.dumps(default_params))
    _git("add", "params.yaml")
    _git("commit", "-q", "-m", "x")
    commit = tracking.git_commit()[:7]
    assert tracking.start_parent(store, invocation="repro").info.run_name == f"repro {commit}"
    default_params["seed"] = 7
    default_params["rl"]["stages"]["main"]["learning_rate"] = 1e-5
    (tmp_path / "params.yaml").write_text(json.dumps(default_params))
    run = tracking.start_parent(store, invocation="pipeline")
    assert run.info.run_name == f"pipeline {commit} (rl.stages.main.learning_rate=1e-05, seed=7)"
    assert run.data.tags["rung.invocation"] == "pipeline" and run.data.tags["rung.role"] == "pipeline"
    monkeypatch.setenv("DVC_EXP_NAME", "lr-low")
    experiment = tracking.start_parent(store, invocation="repro")
    assert experiment.info.run_name == "lr-low"
    with tracking.stage_run("report", store, logged={}, inputs={}) as child:  # a stage outside dvc joins it
        pass
    assert mlflow.get_run(child.info.run_id).data.tags["mlflow.parentRunId"] == experiment.info.run_id
    monkeypatch.setenv("DVC_EXP_NAME", "lr-high")  # another experiment: a parent of its own
    with tracking.stage_run("report", store, logged={}, inputs={}) as child:
        pass
    parent = mlflow.get_run(mlflow.get_run(child.info.run_id).data.tags["mlflow.parentRunId"])
    assert parent.info.run_name == "lr-high" and parent.data.tags["rung.invocation"] == "stage"


def test_tables_on_a_run(store):
    tracking.setup(store)
    run = mlflow.MlflowClient().create_run(tracking.setup(store), run_name="p")
    tracking.log_tables(
        run.info.run_id, {"t.json": (["a", "b"], [["r1", "x"], ["r2", "y"]]), "empty.json": (["a"], [])}
    )
    assert [a.path for a in mlflow.MlflowClient().list_artifacts(run.info.run_id)] == ["t.json"]
    table = mlflow.load_table("t.json", run_ids=[run.info.run_id])
    assert table[["a", "b"]].values.tolist() == [["r1", "x"], ["r2", "y"]]
