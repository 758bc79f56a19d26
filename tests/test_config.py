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
            "params.yaml: rl.stages.main.preset: 'ppo' is not a preset ['grpo', 'dr_grpo', 'dapo', 'gspo', 'psr', "
            "'nsr', 'w_reinforce']",
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
    # DVC refuses a mapping with a key twice (PyYAML alone would keep the last): so does validate
    twice = tmp_path / "twice.yaml"
    twice.write_text("seed: 1\nreward_models: {}\nreward_models:\n  rm: {}\n")
    with pytest.raises(
        config.ConfigError, match=r"twice.yaml: not valid YAML: duplicate key 'reward_models' \(line 3\)$"
    ):
        config.load(twice)


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


# Credentials a params.yaml may hold, each where rung would log it: (dotted key, value, the secret in the value,
# the refusal after "params.yaml: "). Shared with the scan of a stage's MLflow run (tests/test_tracking.py).
_ARGS = "rl.stages.main.rewards.accuracy.args"


def _arg(name: str, value: object) -> tuple[str, dict]:
    """The setting that gives the accuracy reward's factory argument `name`."""
    return "rl.stages.main.rewards.accuracy", {"args": {name: value}}


CREDENTIALS = [
    # in a URL: userinfo (any case of scheme, leading whitespace, percent-encoded or raw reserved characters)
    ("tracking.uri", "HTTP://rung:planted0pw@host:5000", "planted0pw", "tracking.uri: has a password in it"),
    ("tracking.uri", "  https://rung:planted0pw@host", "planted0pw", "tracking.uri: has a password in it"),
    ("tracking.uri", "https://ghp_planted0user0token@host", "ghp_planted", "tracking.uri: has a user name"),
    ("tracking.uri", "https://rung:planted%3A0pw@host", "planted%3A0pw", "tracking.uri: has a password in it"),
    ("tracking.uri", "https://rung:planted/0pw@host:5000", "planted/0pw", "tracking.uri: has a password in it"),
    (
        "rl.stages.main.trl.vllm_server_base_url",
        "http://user:planted0pw@node1:8000",
        "planted0pw",
        "rl.stages.main.trl.vllm_server_base_url: has a password in it",
    ),
    ("eval.sets.0.config.url", "s3+Https://me:planted0pw@bucket/x", "planted0pw", "eval.sets.0.config.url: has a"),
    # in a URL: a query or fragment that signs or authorizes the request (S3, Azure SAS, Google, OAuth)
    (
        "model.source",
        "https://host/model?access_token=planted0qs",
        "planted0qs",
        "model.source: has a query parameter 'access_token'",
    ),
    (
        "model.source",
        "https://b.s3.amazonaws.com/m?X-Amz-Date=1&X-Amz-Signature=planted0sig",
        "planted0sig",
        "model.source: has a query parameter 'X-Amz-Signature'",
    ),
    ("curate.sources.0.config.url", "https://a.blob/x?sv=1&sig=planted0sas", "planted0sas", "curate.sources.0.config"),
    (*_arg("endpoints", ["http://ok", "https://g/x?key=planted0gkey"]), "planted0gkey", f"{_ARGS}.endpoints.1: "),
    (
        "rl.stages.main.trl.vllm_server_base_url",
        "http://node1:8000/#access_token=planted0frag",
        "planted0frag",
        "rl.stages.main.trl.vllm_server_base_url: has a fragment parameter 'access_token'",
    ),
    (*_arg("cmd", "pip install git+https://planted0tok@github.com/o/r"), "planted0tok", f"{_ARGS}.cmd: has a user"),
    # a key that names one, at any depth, mappings in lists included
    (
        "rl.stages.main.trl.model_init_kwargs",
        {"headers": {"Authorization": "Bearer planted0bearer"}},
        "planted0bearer",
        "rl.stages.main.trl.model_init_kwargs.headers.Authorization: a credential",
    ),
    ("rl.stages.main.trl.model_init_kwargs.token", "hf_planted", "hf_planted", "rl.stages.main.trl.model_init_kwargs."),
    ("rl.stages.main.trl.hub_token", "hf_planted", "hf_planted", "rl.stages.main.trl.hub_token: a credential"),
    (*_arg("API_KEY", "planted0k"), "planted0k", f"{_ARGS}.API_KEY: a credential"),
    ("curate.sources.0.config.client_secret", "planted0s", "planted0s", "curate.sources.0.config.client_secret: a c"),
    *(
        (*_arg("clients", [{"name": "a"}, {key: "planted0" + key}]), "planted0" + key, f"{_ARGS}.clients.1.{key}: ")
        for key in (
            "secret_key",
            "aws_secret_key",
            "private_key",
            "credentials",
            "passphrase",
            "auth",
            "pwd",
            "bearer",
            "cookie",
            "secretKey",
            "X-Api-Key",
        )
    ),
    (*_arg("auth", ["user", "planted0pair"]), "planted0pair", f"{_ARGS}.auth: a credential"),
]


# Values under keys that only look like a credential's.
LOOKALIKES = {
    "rl.stages.main.trl": {"pad_token": "<pad>", "model_init_kwargs": {"token": True, "use_auth_token": False}},
    "tracking.uri": "http://orch:5000/a@b?experiment=k",
    "rl.stages.main.max_completion_length": 48,
    "rl.stages.main.rewards.accuracy": {
        "args": {
            "tokenizer": "gpt2",
            "max_new_tokens": 8,
            "special_tokens": ["<a>"],
            "keys": ["a"],
            "key": "answer",
            "authors": ["x"],
            "auth_mode": "none",
            "token_file": "/run/secrets/hf",
            "secret_name": "hf-token",
            "signature": "f(x)",
            "repo": "git+ssh://git@github.com/o/r",
            "page": "https://example.org/docs?page=2&sort=key#section",
        }
    },
}


@pytest.mark.parametrize("key, value, secret, expected", CREDENTIALS, ids=[f"{c[0]}={c[2]}" for c in CREDENTIALS])
def test_no_credential_in_any_param(default_params, key, value, secret, expected):
    """Params are logged to MLflow and the RL stages' are kept in dvc.lock: a credential anywhere is refused
    in one line naming its key, never showing it, whatever the form of the URL or the depth of the mapping."""
    message = _error(config.with_overrides(default_params, {key: value}))
    assert message.startswith(f"params.yaml: {expected}") and "\n" not in message, message
    assert secret not in message and "planted" not in message  # the error line itself keeps the secret out


def test_credential_lookalikes_are_accepted(default_params):
    """The tokenizer's special tokens and token counts, HF's `token: true` (use the stored login), keys that
    only begin like a credential's, a URL with a '@' in its path or a query without a credential, and a login
    name over ssh are no credentials."""
    params = config.parse(config.with_overrides(default_params, LOOKALIKES))
    assert params.tracking.uri == "http://orch:5000/a@b?experiment=k"


@pytest.mark.parametrize(
    "url, shown",
    [
        ("HTTP://rung:pw@host:5000/x", "HTTP://rung:***@host:5000/x"),
        ("https://:pw@host", "https://:***@host"),
        ("http://host:5000/a@b", "http://host:5000/a@b"),
        ("https://TOKEN@host/x", "https://***@host/x"),
        ("  https://u:pw@host", "  https://u:***@host"),
        ("https://u:p%3Aw@host", "https://u:***@host"),
        ("https://u:p/w@host:5000/x", "https://***@host:5000/x"),
        ("https://u:p#w@host", "https://***@host"),
        (
            "https://h/x?a=1&X-Amz-Signature=s&key=k#access_token=t",
            "https://h/x?a=1&X-Amz-Signature=***&key=***#access_token=***",
        ),
        ("https://[::1", "https://[::1"),
        ("https://u:pw@[::1", "https://***@[::1"),
        ("MLflow at https://u:pw@h and http://TOKEN@g", "MLflow at https://u:***@h and http://***@g"),
    ],
)
def test_redact_hides_every_credential_of_a_url_and_never_fails(url, shown):
    from rung.redaction import redact

    assert redact(url) == shown


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
