from __future__ import annotations

import copy
import os
import subprocess
import sys

import pytest
import yaml

from rung import config
from tests.conftest import ROOT
from tests.workspace import local_identity


def _error(data: dict) -> str:
    with pytest.raises(config.ConfigError) as e:
        config.parse(data)
    return str(e.value)


def test_default_params_are_valid(default_params):
    params = config.parse(default_params)
    assert params.checkpoints == ["base", "sft", "rl/main"]


@pytest.mark.parametrize(
    "path, value, expected",
    [
        (
            ("rl", "stages", "main", "learning_rate"),
            -1.0,
            "params.yaml: rl.stages.main.learning_rate: Input should be greater than 0",
        ),
        (("sft", "max_steps"), "ten", "params.yaml: sft.max_steps: Input should be a valid integer"),
        (
            ("difficulty", "sampling", "top_p"),
            1.5,
            "params.yaml: difficulty.sampling.top_p: Input should be less than or equal to 1",
        ),
        (("rl", "stages", "main", "loss_type"), "ppo", "params.yaml: rl.stages.main.loss_type: Input should be"),
        (
            ("rl", "stages", "main", "init"),
            "rl/later",
            "params.yaml: rl.stages.main.init: 'rl/later' is not one of ['base', 'sft']",
        ),
        (
            ("difficulty", "pass_rate_max"),
            -0.1,
            "params.yaml: difficulty.pass_rate_max: Input should be greater than or equal to 0",
        ),
        (("sft", "lr"), 1e-5, "params.yaml: sft.lr: unknown key"),
        (
            ("rl", "stages", "main", "preset"),
            "ppo",
            "params.yaml: rl.stages.main.preset: Input should be 'grpo', 'dr_grpo', 'dapo', 'gspo', 'psr', 'nsr' or "
            "'w_reinforce'",
        ),
        (
            ("rl", "stages", "main", "curriculum"),
            {"type": "staged", "phases": [{"buckets": ["tricky"]}]},
            "params.yaml: rl.stages.main: unknown difficulty buckets ['tricky']",
        ),
        (
            ("rl", "stages", "main", "curriculum"),
            {"type": "staged", "phases": [{"buckets": ["easy"]}, {"buckets": ["hard"]}]},
            "params.yaml: rl.stages.main.curriculum.staged.phases: "
            "every phase but the last needs an increasing until_step",
        ),
        (
            ("rl", "stages", "main", "rewards"),
            {"brevity": 0.5},
            "params.yaml: rl.stages.main.rewards.brevity: not a built-in reward",
        ),
        (
            ("rl", "stages", "main", "curriculum"),
            {"type": "pools", "pools": {"a": {"max_pass_rate": 0.5, "weight": 1}}},
            "params.yaml: rl.stages.main.curriculum.pools.pools: the largest max_pass_rate must be 1.0",
        ),
        (("sft", "epochs"), 2, "params.yaml: sft.max_steps: set exactly one of max_steps and epochs"),
        (("sft", "traces"), [{"type": "distill"}], "params.yaml: sft.traces.0.distill.model: distill needs a teacher"),
    ],
)
def test_bad_values_name_the_dotted_key(default_params, path, value, expected):
    data = copy.deepcopy(default_params)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    message = _error(data)
    assert message.startswith(expected)
    assert "\n" not in message


def test_empty_keep_window_rejected(default_params):
    default_params["difficulty"].update(pass_rate_min=0.8, pass_rate_max=0.2)
    assert _error(default_params) == "params.yaml: difficulty: pass_rate_min (0.8) exceeds pass_rate_max (0.2)"


def test_duplicate_source_names_rejected(default_params):
    default_params["curate"]["sources"].append(dict(default_params["curate"]["sources"][0]))
    assert "curate: source names must be unique" in _error(default_params)


def test_rl_stage_can_chain_from_earlier_stage(default_params):
    stages = default_params["rl"]["stages"]
    stages["long"] = {**stages["main"], "init": "rl/main", "max_completion_length": 96}
    assert config.parse(default_params).checkpoints == ["base", "sft", "rl/main", "rl/long"]


def test_cli_validate_exit_codes(tmp_path, default_params):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(default_params))
    ok = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(good)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    default_params["eval"]["sampling"]["batch_size"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(default_params))
    res = subprocess.run([sys.executable, "-m", "flows.cli", "validate", str(bad)], capture_output=True, text=True)
    assert res.returncode == 2
    assert res.stderr.strip() == f"error: {bad}: eval.sampling.batch_size: Input should be greater than 0"


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(config.ConfigError, match="file not found"):
        config.load(tmp_path / "nope.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("seed: [1,\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(broken)


def test_prompts_per_step_must_split_evenly_across_processes(default_params):
    default_params["rl"]["stages"]["main"].update(prompts_per_step=3, launch={"num_processes": 2})
    with pytest.raises(
        config.ConfigError, match=r"rl.stages.main.*prompts_per_step: 3 is not divisible by launch.num_processes 2"
    ):
        config.parse(default_params)


def _warnings(caplog, data: dict) -> tuple[config.Params, list[str]]:
    caplog.clear()
    with caplog.at_level("WARNING", logger="rung.config"):
        params = config.parse(data)
    return params, [r.getMessage() for r in caplog.records]


def test_bandit_step_size_and_its_deprecated_name(default_params, caplog):
    stage = default_params["rl"]["stages"]["main"]
    stage["curriculum"] = {"type": "bandit", "step_size": 0.25}
    params, warned = _warnings(caplog, default_params)
    assert params.rl.stages["main"].curriculum.step_size == 0.25 and warned == []
    stage["curriculum"] = {"type": "bandit", "learning_rate": 0.25}
    params, warned = _warnings(caplog, default_params)
    assert params.rl.stages["main"].curriculum.step_size == 0.25
    assert params.rl.stages["main"].learning_rate == 3e-6  # the optimizer's rate is untouched
    assert warned == [
        "params.yaml: rl.stages.main.curriculum.learning_rate: deprecated, renamed step_size; "
        "read as step_size (rename it)"
    ]
    stage["curriculum"] = {"type": "bandit", "learning_rate": 0.25, "step_size": 0.5}
    assert (
        _error(default_params)
        == "params.yaml: rl.stages.main.curriculum.learning_rate: renamed step_size; set step_size only, not both"
    )
    stage["curriculum"] = {"type": "adaptive", "learning_rate": 0.25}  # only the bandit had it
    assert _error(default_params) == "params.yaml: rl.stages.main.curriculum.adaptive.learning_rate: unknown key"


def test_sft_eval_every_is_ignored_with_a_warning(default_params, caplog):
    """SFT never read eval_every (the RL stage's held-out curve); a file that sets it still validates."""
    default_params["sft"]["eval_every"] = 5
    params, warned = _warnings(caplog, default_params)
    assert "eval_every" not in params.sft.model_dump()
    assert warned == ["params.yaml: sft.eval_every: deprecated and has no effect; ignored (remove it)"]


def test_cli_validate_prints_the_deprecation_on_stderr(tmp_path, default_params):
    default_params["rl"]["stages"]["main"]["curriculum"] = {"type": "bandit", "learning_rate": 0.25}
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(default_params))
    local_identity(tmp_path)  # else validate warns, on a machine without a git identity, that `dvc exp run` will fail
    cmd = [sys.executable, "-m", "flows.cli", "validate", str(path)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr
    assert res.stderr.splitlines() == [
        f"{path}: rl.stages.main.curriculum.learning_rate: deprecated, renamed step_size; read as step_size (rename it)"
    ]


@pytest.mark.parametrize(
    "edits, expected",
    [
        # an upper-case scheme passed the old check
        ({"tracking.uri": "HTTP://rung:pw@host:5000"}, "tracking.uri: has a password in it"),
        # pass-through mappings are checked too: TRL's own vllm_server_base_url, model_init_kwargs.token
        (
            {"rl.stages.main.trl": {"vllm_server_base_url": "http://user:pw@node1:8000"}},
            "rl.stages.main.trl.vllm_server_base_url: has a password in it",
        ),
        (
            {"rl.stages.main.trl": {"model_init_kwargs": {"token": "hf_abcdef"}}},
            "rl.stages.main.trl.model_init_kwargs.token: a credential",
        ),
        ({"rl.stages.main.trl": {"hub_token": "hf_abcdef"}}, "rl.stages.main.trl.hub_token: a credential"),
        (
            {"rl.stages.main.rewards": {"accuracy": {"args": {"API_KEY": "k"}}}},
            "rl.stages.main.rewards.accuracy.args.API_KEY: a credential",
        ),
        ({"curate.sources.0.config": {"client_secret": "s"}}, "curate.sources.0.config.client_secret: a credential"),
        ({"model.source": "https://host/model?access_token=abc"}, "model.source: has a query parameter 'access_token'"),
        ({"eval.sets.0.config": {"url": "s3+Https://me:pw@bucket/x"}}, "eval.sets.0.config.url: has a password"),
    ],
)
def test_no_credential_in_any_param(default_params, edits, expected):
    """Params are logged to MLflow and the RL stages' are kept in dvc.lock: a credential anywhere is refused
    in one line naming its key, whatever the case of the URL's scheme or the depth of the mapping."""
    message = _error(config.with_overrides(default_params, edits))
    assert message.startswith(f"params.yaml: {expected}") and "\n" not in message, message
    assert "pw" not in message and "hf_" not in message  # the error line itself keeps the secret out


def test_credential_lookalikes_are_accepted(default_params):
    """The tokenizer's special tokens, HF's `token: true` (use the stored login) and a URL with a user but
    no password are no credentials."""
    data = config.with_overrides(
        default_params,
        {
            "rl.stages.main.trl": {"pad_token": "<pad>", "model_init_kwargs": {"token": True}},
            "tracking.uri": "http://rung@orch:5000",
            "rl.stages.main.max_completion_length": 48,
        },
    )
    assert config.parse(data).tracking.uri == "http://rung@orch:5000"


def test_redact_masks_a_password_in_any_case_of_scheme():
    from rung.errors import redact

    assert redact("HTTP://rung:pw@host:5000/x") == "HTTP://rung:***@host:5000/x"
    assert redact("https://:pw@host") == "https://:***@host"
    assert redact("http://host:5000/a@b") == "http://host:5000/a@b"


def test_a_reward_for_a_task_absent_from_the_data_is_refused(default_params):
    """tests_passed grades code rows; on the default arithmetic it would be accuracy under another name."""
    from rung.answers import verify

    rewards = {"rl.stages.main.rewards": {"tests_passed": 1.0, "format": 0.1}}
    assert _error(config.with_overrides(default_params, rewards)) == (
        "params.yaml: rl.stages.main.rewards.tests_passed: grades code rows, and curate.sources has none "
        "(tasks: basic_arithmetic, chain_sum); use accuracy"
    )
    code = {"type": "code", "name": "fns", "problems": "functions", "size": 20}
    with_code = config.with_overrides(default_params, {**rewards, "curate.sources.1": code})
    params = config.parse(with_code)
    assert params.curate.sources[1].task == verify.CODE  # the config's name of the code task is the verifier's
    mix = {"curate.mix": {"total": 100, "weights": {"arith_easy": 1.0, "fns": 0.0}}}
    assert "rewards.tests_passed: grades code rows" in _error(config.with_overrides(with_code, mix))
