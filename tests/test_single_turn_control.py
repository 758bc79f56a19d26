"""The single-turn control of an experiment with episodes (issue #47 item 5): `rl.stages.<name>.environment: false`
trains that stage single-turn while the experiment's environment runs difficulty, evaluation and the other stages;
the report compares each episode-trained RL checkpoint with the single-turn one of the same init on the final and
on the first answers (exact McNemar, rung.eval.paired), in report.md, comparisons.json and MLflow."""

from __future__ import annotations

import copy

import pytest
from scipy.stats import binomtest

from rung import config, files
from rung.checks.environments import environments, used
from rung.errors import InputError
from rung.eval import comparisons
from rung.report import keys, pipeline
from tests.test_report_episodes import INIT_FINAL, INIT_FIRST, RL_FINAL, RL_FIRST, _write

RETRY = {"name": "retry", "max_turns": 2}


def _params(default_params: dict, environment: dict | None, single: object) -> config.Params:
    """params.yaml with two RL stages from sft: `episodes` (the experiment's environment) and `single`, whose
    `environment` is `single`."""
    data = copy.deepcopy(default_params)
    main = data["rl"]["stages"].pop("main")
    data["rl"]["stages"] = {"episodes": main, "single": {**main, "environment": single}}
    if environment is not None:
        data["environment"] = environment
    return config.parse(data)


def test_environment_false_trains_the_stage_single_turn(default_params):
    params = _params(default_params, RETRY, False)
    assert params.environment_of("single") is None
    assert params.environment_of("episodes") == params.environment_of() == params.environment
    assert list(used(params)) == ["environment"]  # the preflight checks the experiment's environment only
    # a stage's own environment still wins, and null still inherits
    assert _params(default_params, RETRY, {"name": "python"}).environment_of("single").name == "python"
    assert _params(default_params, RETRY, None).environment_of("single") == params.environment


@pytest.mark.parametrize("value, shown", [(True, "true"), (1, "1")])
def test_params_refuse_an_environment_that_is_none_of_the_three(default_params, value, shown):
    with pytest.raises(
        config.ConfigError,
        match=rf"^params.yaml: rl.stages.single.environment: {shown} is not an environment: null runs the "
        r"experiment's, a name or mapping names this stage's own, false trains it single-turn$",
    ):
        _params(default_params, RETRY, value)


def test_an_environment_by_its_name_alone_is_the_short_form(default_params):
    """`environment: python` (as docs/recipes.md writes it) is `{name: python}`, for the experiment and a stage."""
    params = _params(default_params, "retry", "python")
    assert params.environment == config.EnvironmentParams(name="retry")
    assert params.environment_of("single") == config.EnvironmentParams(name="python")


def test_an_opt_out_without_an_experiment_environment_is_refused(default_params):
    params = _params(default_params, None, False)
    with pytest.raises(
        InputError, match=r"^rl.stages.single.environment: false opts out of the experiment's environment, and it has"
    ):
        environments(params)


# The single-turn control, evaluated in the same episodes: first right on 12, final on 20. Against rl/episodes
# (first right on 20, final on 24): first answers 2 right -> wrong and 10 wrong -> right, final answers 0 and 4.
SINGLE_FIRST = [True] * 12 + [False] * 18
SINGLE_FINAL = [True] * 20 + [False] * 10
PAIR = "rl-episodes-vs-rl-single"


@pytest.fixture
def with_control(tmp_path, monkeypatch, default_params):
    monkeypatch.chdir(tmp_path)
    params = _params(default_params, RETRY, False)
    evals = {
        "base": _write("base", INIT_FIRST, INIT_FINAL),
        "sft": _write("sft", INIT_FIRST, INIT_FINAL),
        "rl/episodes": _write("rl/episodes", RL_FIRST, RL_FINAL),
        "rl/single": _write("rl/single", SINGLE_FIRST, SINGLE_FINAL),
    }
    inits = {n: s.init for n, s in params.rl.stages.items()}
    pairs = comparisons.pairs(inits, comparisons.episode_trained(params))
    compared = comparisons.comparisons(pairs, 0.95, 200, 0)
    text = pipeline.run(evals, {}, {}, {"seed": 0}, compared)
    controls = comparisons.single_turn_controls(inits, comparisons.episode_trained(params))
    return pairs, compared, text, keys.headline_metrics(evals, compared, inits, controls)


def test_the_episode_trained_checkpoint_is_compared_with_its_single_turn_control(with_control):
    pairs, compared, _, _ = with_control
    assert pairs[-1] == ("rl/episodes", "rl/single") and pairs.count(("rl/episodes", "rl/single")) == 1
    test = compared.comparisons[PAIR].sets["test"]
    assert (test.right_to_wrong, test.wrong_to_right) == (0, 4)
    assert test.mcnemar_p == pytest.approx(binomtest(4, 4, 0.5).pvalue) == pytest.approx(0.125)
    assert (test.accuracy_old, test.accuracy_new) == (20 / 30, 24 / 30)
    first = test.first_answer
    assert first is not None and (first.right_to_wrong, first.wrong_to_right) == (2, 10)
    assert first.mcnemar_p == pytest.approx(binomtest(10, 12, 0.5).pvalue) == pytest.approx(158 / 4096)
    # the final- and first-answer tests of one pair on one set are one Holm family: 2 x 158/4096 = 0.077
    assert first.p_adjusted == pytest.approx(2 * 158 / 4096)
    assert first.verdict.startswith("not significant at 0.05 (exact McNemar)")


def test_the_pair_is_in_report_md_comparisons_json_and_mlflow(with_control):
    _, compared, text, headline = with_control
    final = "| rl/episodes vs rl/single | test | 30 | 66.7% → 80.0% |"
    first = "| rl/episodes vs rl/single | test | 30 | 40.0% → 66.7% |"
    assert "| 0 | 4 | 0.12 (Holm over 2) | not significant at 0.05 (exact McNemar);" in next(
        line for line in text.splitlines() if line.startswith(final)
    )
    first_line = next(line for line in text.splitlines() if line.startswith(first))
    assert "| 2 | 10 |" in first_line and "| not significant at 0.05 (exact McNemar)" in first_line
    dumped = files.read_json(pipeline.COMPARISONS)["comparisons"][PAIR]
    assert (dumped["new"], dumped["old"]) == ("rl/episodes", "rl/single")
    assert dumped["sets"]["test"]["first_answer"]["mcnemar_p"] == pytest.approx(158 / 4096)
    # the report run logs every pair as flows/report.py does; the parent run gets the pair's headline
    logged = keys.metric_keys({PAIR: compared.comparisons[PAIR].dump()["sets"]}, "paired")
    assert logged[f"paired/{PAIR}/test/mcnemar_p"] == pytest.approx(0.125)
    assert logged[f"paired/{PAIR}/test/first_answer/mcnemar_p"] == pytest.approx(158 / 4096)
    assert headline[f"paired/{PAIR}/test/mcnemar_p"] == pytest.approx(0.125)
    assert headline[f"paired/{PAIR}/test/difference"] == pytest.approx(4 / 30)
    assert headline[f"paired/{PAIR}/test/first_answer/mcnemar_p"] == pytest.approx(158 / 4096)
    assert headline[f"paired/{PAIR}/test/first_answer/difference"] == pytest.approx(8 / 30)


@pytest.mark.parametrize("environment, single", [(RETRY, None), (None, None), (RETRY, {"name": "python"})])
def test_no_control_pair_without_a_single_turn_stage_beside_an_episode_trained_one(default_params, environment, single):
    params = _params(default_params, environment, single)
    inits = {n: s.init for n, s in params.rl.stages.items()}
    assert comparisons.single_turn_controls(inits, comparisons.episode_trained(params)) == []
    assert not [p for p in comparisons.pairs(inits, comparisons.episode_trained(params)) if p[1].startswith("rl/")]


def test_a_control_pairs_only_with_episode_stages_of_its_own_init():
    inits = {"ep": "sft", "zero_ep": "base", "control": "sft", "zero_control": "base", "more": "rl/ep"}
    assert comparisons.single_turn_controls(inits, ["ep", "zero_ep", "more"]) == [
        ("rl/ep", "rl/control"),
        ("rl/zero_ep", "rl/zero_control"),
    ]
