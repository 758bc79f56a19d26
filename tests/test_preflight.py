"""A catalogue of bad inputs, each refused by `rung validate` before any compute: exit code 2, one
line naming the key (with the stage's real name) or the file, and data/ untouched."""

from __future__ import annotations

import importlib
import shutil
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import flows.curate
import flows.rl
import flows.sft
from flows.cli import app
from flows.stage import preflight as stage_preflight
from rung import config, files, preflight
from rung.errors import InputError
from tests import imports
from tests.conftest import ROOT


def _reward_not_taking_completions(answer):  # used by a case below through its import path
    return [0.0]


class NoReset:  # environments refused by cases below, through their import paths
    def lookup(self, word: str) -> str:
        """Look a word up.

        Args:
            word: The word.
        """
        return word


class FailsToStart:
    def __init__(self) -> None:
        raise RuntimeError("no license server")

    def reset(self, **row) -> None:
        return None


class NarrowReset:
    def reset(self, prompt) -> None:  # TRL passes every column of the row, not the prompt alone
        return None


class UndocumentedTool:
    def reset(self, **row) -> None:
        return None

    def lookup(self, word):
        return word


CASES = {
    # (edits as (dotted key, value); the start of the expected one-line error)
    "unknown key": ([("rl.stages.main.learning_rat", 1e-6)], "error: params.yaml: rl.stages.main.learning_rat"),
    "wrong type": ([("sft.max_steps", "many")], "error: params.yaml: sft.max_steps"),
    "a password in the tracking URI": (  # params are logged to MLflow and kept in dvc.lock
        [("tracking.uri", "http://rung:s3cret@orch:5000")],
        "error: params.yaml: tracking.uri: has a password in it, and params are logged to MLflow and kept in "
        "dvc.lock; set MLFLOW_TRACKING_USERNAME",
    ),
    "a token in a pass-through mapping": (
        [("rl.stages.main.trl", {"model_init_kwargs": {"token": "hf_planted"}})],
        "error: params.yaml: rl.stages.main.trl.model_init_kwargs.token: a credential",
    ),
    "a code reward on arithmetic tasks": (
        [("rl.stages.main.rewards", {"tests_passed": 1.0})],
        "error: params.yaml: rl.stages.main.rewards.tests_passed: grades code rows, and curate.sources has none",
    ),
    "negative learning rate": (
        [("rl.stages.main.learning_rate", -1.0)],
        "error: params.yaml: rl.stages.main.learning_rate",
    ),
    "window min > max": (
        [("difficulty.pass_rate_min", 0.9), ("difficulty.pass_rate_max", 0.1)],
        "error: params.yaml: difficulty",
    ),
    "no RL stage": ([("rl.stages", {})], "error: params.yaml: rl.stages"),
    "init of an unknown stage": ([("rl.stages.main.init", "rl/nope")], "error: params.yaml: rl.stages.main.init"),
    "uneven prompts over processes": (
        [("rl.stages.main.prompts_per_step", 3), ("rl.stages.main.launch", {"num_processes": 2})],
        "error: params.yaml: rl.stages.main",
    ),
    "empty source file": (
        [("curate.sources", [{"name": "mine", "type": "file", "path": "empty.jsonl"}])],
        "error: curate.sources.mine.path: empty.jsonl is empty",
    ),
    "missing source file": (
        [("curate.sources", [{"name": "mine", "type": "file", "path": "nope.jsonl"}])],
        "error: curate.sources.mine.path: nope.jsonl not found",
    ),
    "source without its answer column": (
        [("curate.sources", [{"name": "mine", "type": "file", "path": "noanswer.jsonl"}])],
        "error: curate.sources.mine.columns.answer",
    ),
    "unknown reasoning-gym task": (
        [("curate.sources.0.task", "no_such_task")],
        "error: curate.sources.arith_easy.task: unknown reasoning-gym task",
    ),
    "config a task rejects": (
        [("curate.sources.0.config", {"min_terms": 5, "max_terms": 2})],
        "error: curate.sources.arith_easy.config",
    ),
    "an environment with a tool on SmolLM2's own chat template": (
        [("environment", {"name": "python"})],
        "error: environment: Python has tools (python) but SmolLM2-135M-Instruct's chat template cannot render a "
        "tool call; fix: set model.chat_template: tools",
    ),
    "an environment class that does not load": (
        [("rl.stages.main.environment", {"name": "no_such_module:Env"})],
        "error: rl.stages.main.environment.name: cannot load 'no_such_module:Env': ModuleNotFoundError",
    ),
    "an environment class without reset": (
        [("environment", {"name": "tests.test_preflight:NoReset"})],
        "error: environment.name: NoReset has no reset() method",
    ),
    "a tool without a docstring": (
        [("environment", {"name": "tests.test_preflight:UndocumentedTool"}), ("model.chat_template", "tools")],
        "error: environment.name: tool UndocumentedTool.lookup: ",
    ),
    "an environment class that fails to start": (
        [("environment", {"name": "tests.test_preflight:FailsToStart"})],
        "error: environment.settings: FailsToStart(**settings) raised RuntimeError: no license server",
    ),
    "a reset without **kwargs": (
        [("environment", {"name": "tests.test_preflight:NarrowReset"})],
        "error: environment.name: NarrowReset.reset takes no **kwargs, and it gets every column of a row",
    ),
    "an episode of ten thousand turns": (
        [("rl.stages.main.environment", {"name": "retry", "max_turns": 10000})],
        "error: params.yaml: rl.stages.main.environment.max_turns: Input should be less than or equal to 32",
    ),
    "a built-in by its name alone, refused for the right reason": (
        [("environment", "python")],
        "error: environment: Python has tools (python) but SmolLM2-135M-Instruct's chat template cannot render",
    ),
    "an episode of no turn": (
        [("environment", {"name": "retry", "max_turns": 0})],
        "error: params.yaml: environment.max_turns: Input should be greater than or equal to 1",
    ),
    "eval set of an unknown task": ([("eval.sets.0.task", "no_such_task")], "error: eval.sets.chain_sum_4terms.task"),
    "model path that does not exist": (
        [("model.source", "./no/such/model")],
        "error: model.source: directory not found",
    ),
    "model dir without a tokenizer": (
        [("model.source", "./half_model")],
        "error: model.source: ./half_model has no tokenizer",
    ),
    "teacher that does not exist": (
        [("sft.traces", [{"type": "distill", "model": "./no/teacher"}])],
        "error: sft.traces.model: directory not found",
    ),
    "reward import that fails": (
        [("rl.stages.main.rewards", {"mine": {"import": "no_such_module:f"}})],
        "error: rl.stages.main.rewards.mine.import: cannot load 'no_such_module:f'",
    ),
    "reward without completions": (
        [("rl.stages.main.rewards", {"mine": {"import": "tests.test_preflight:_reward_not_taking_completions"}})],
        "error: rl.stages.main.rewards.mine.import: "
        "'tests.test_preflight:_reward_not_taking_completions' must accept completions",
    ),
    "answer_pattern that does not compile": (
        [("eval.sets", [{"type": "file", "name": "bench", "path": "bench.jsonl", "answer_pattern": "(\\d+"}])],
        "error: params.yaml: eval.sets.0.answer_pattern: does not compile",
    ),
    "answer_pattern matching none of the first rows": (
        [("eval.sets", [{"type": "file", "name": "bench", "path": "bench.jsonl", "answer_pattern": "Answer: (\\d+)"}])],
        "error: eval.sets.bench.answer_pattern: matches none of the first 2 rows of bench.jsonl",
    ),
    "answer_pattern beside answer_from boxed": (
        [
            (
                "curate.sources",
                [
                    {
                        "type": "file",
                        "name": "mine",
                        "path": "bench.jsonl",
                        "answer_from": "boxed",
                        "answer_pattern": "(x)",
                    }
                ],
            )
        ],
        "error: params.yaml: curate.sources.0.answer_pattern: set answer_pattern or answer_from: boxed, not both",
    ),
    "gsm8k answers without a '####' line": (
        [("curate.sources", [{"type": "file", "name": "mine", "path": "bench.jsonl", "answer_from": "gsm8k"}])],
        "error: curate.sources.mine.answer_from: gsm8k, but none of the first 2 rows",
    ),
    "unknown benchmark": (
        [("eval.sets", [{"type": "benchmark", "name": "math5000"}])],
        "error: params.yaml: eval.sets.0.benchmark: unknown benchmark 'math5000'",
    ),
    "benchmark copy that does not exist": (
        [("eval.sets", [{"type": "benchmark", "name": "math500", "dataset": "./no/math500"}])],
        "error: eval.sets.math500.dataset: directory not found: ./no/math500",
    ),
    "FSDP without CUDA": (
        [("rl.stages.main.launch", {"num_processes": 2, "accelerate_config": "fsdp"})],
        "error: rl.stages.main.launch.accelerate_config: fsdp.yaml (FSDP / DeepSpeed) needs CUDA GPUs",
    ),
    "vllm without its environment": (
        [("generation.backend", "vllm"), ("generation.vllm.python", "./no-venv/bin/python")],
        "error: generation.vllm.python: no-venv/bin/python not found (create the vLLM environment with `make vllm",
    ),
    "vllm memory share above 1": (
        [("generation.backend", "vllm"), ("generation.vllm.gpu_memory_utilization", 1.5)],
        "error: params.yaml: generation.vllm.gpu_memory_utilization: Input should be less than or equal to 1",
    ),
    "RL vllm without vllm in rung's environment": (
        [("rl.stages.main.use_vllm", True)],
        "error: rl.stages.main.use_vllm: vllm is not installed in rung's environment",
    ),
    "unknown answer style": (
        [("format.style", "latex")],
        "error: params.yaml: format.style: Input should be 'answer_line', 'boxed', 'tags' or 'code'",
    ),
    "plain template without {prompt}": (
        [("format.template", "plain"), ("format.plain_template", "Question? Answer:")],
        "error: params.yaml: format.plain_template: must contain {prompt}",
    ),
    **{
        f"chat template on a base {role}": (
            [(key, value)],
            f"error: format.template: chat, but {where} has no chat template",
        )
        for role, key, value, where in [
            ("model", "model.source", "./base_model", "model.source './base_model'"),
            (
                "teacher",
                "sft.traces",
                [{"type": "distill", "model": "./base_model"}],
                "sft.traces.model './base_model'",
            ),
        ]
    },
}


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_text("")
    files.write_jsonl(tmp_path / "noanswer.jsonl", [{"prompt": "1 + 1?", "solution": "2"}])
    files.write_jsonl(
        tmp_path / "bench.jsonl",
        [{"prompt": "1 + 1?", "answer": "The result is 2"}, {"prompt": "2 + 2?", "answer": "The result is 4"}],
    )
    (tmp_path / "half_model").mkdir()
    (tmp_path / "half_model" / "config.json").write_text("{}")
    (tmp_path / "base_model").mkdir()  # a base model: config and tokenizer, no chat template
    (tmp_path / "base_model" / "config.json").write_text("{}")
    (tmp_path / "base_model" / "tokenizer_config.json").write_text('{"model_max_length": 4096}')
    files.write_jsonl(tmp_path / "data" / "curated" / "train.jsonl", [{"id": "x"}])  # earlier outputs
    return tmp_path


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="some cases are what a CPU-only machine rejects")
def test_each_bad_input_is_refused_in_one_line_before_any_compute(workdir, default_params):
    runner = CliRunner()
    before = files.md5(workdir / "data")
    start = time.perf_counter()
    for name, (edits, expected) in CASES.items():
        params = config.with_overrides(default_params, dict(edits))
        (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        res = runner.invoke(app, ["validate", "params.yaml"])
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2, (name, res.output)
        assert len(lines) == 1 and lines[0].startswith(expected), (name, lines)
    print(f"{len(CASES)} bad inputs refused in {time.perf_counter() - start:.1f} s")  # reported, not asserted
    assert files.md5(workdir / "data") == before
    assert len(CASES) >= 15


def test_a_stage_runs_only_the_checks_of_what_it_runs(default_params):
    """A bad reward import stops the RL stage (and `rung validate`) before any compute, but not the
    stages that never load rewards: each preflights what it runs, so its DVC deps are its own imports."""
    data = yaml.safe_load(yaml.safe_dump(default_params))
    data["rl"]["stages"]["main"]["rewards"] = {"mine": {"import": "no_such_module:f"}}
    params = config.parse(data)
    for module in (flows.curate, flows.sft):
        stage_preflight(params, module.CHECKS)
    for everything in (flows.rl.CHECKS, (preflight.check,)):
        with pytest.raises(InputError, match=r"^rl.stages.main.rewards.mine.import: cannot load"):
            stage_preflight(params, everything)


def test_every_check_of_the_preflight_is_some_stage_s():
    flows = {importlib.import_module(module) for module in imports.stage_modules().values()}
    run = {check for flow in flows for check in flow.CHECKS}
    assert set(preflight.ALL) <= run


def test_a_machine_without_a_git_identity_is_told_before_dvc_exp_run_fails(
    default_params, tmp_path, monkeypatch, caplog
):
    from rung.checks import workspace

    monkeypatch.chdir(tmp_path)  # outside any repository: no local identity
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    for variable in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL"):
        monkeypatch.delenv(variable, raising=False)
    params = config.Params.model_validate(default_params)
    workspace.warn_git_identity(params)  # rung validate, make demo: `dvc repro` needs no identity
    assert [r.getMessage() for r in caplog.records] == [
        f"git has no user.name or user.email: `dvc exp run` (sweeps, studies) will fail; set it: {workspace.FIX}"
    ]
    with pytest.raises(InputError, match=r"^git has no user.name or user.email, and DVC experiments are git commits"):
        workspace.git_identity(params)  # the sweep and the study refuse before queuing
    caplog.clear()
    (tmp_path / "gitconfig").write_text("[user]\n\tname = A\n\temail = a@example.com\n")
    workspace.warn_git_identity(params)
    workspace.git_identity(params)
    assert caplog.records == []


def test_lora_target_modules_the_model_lacks_are_refused_before_any_compute(workdir, default_params, tiny_model):
    """peft fails when training starts on a target that names no module it can adapt; `rung validate`
    says it first, in one line naming the key and some valid names, checked on the model's config alone."""
    from rung.checks.models import lora_targets

    runner = CliRunner()
    valid = "modules LoRA can adapt: down_proj, embed_tokens, gate_proj, k_proj, lm_head, o_proj, q_proj, up_proj"
    for key in ("rl.stages.main.lora", "sft.lora"):
        for targets, error in [
            (["q_proj", "v_proj"], None),  # the embedded model has both
            (["q_proj", "qproj"], f"error: {key}.target_modules: 'qproj' names no module of embedded; {valid}, v_proj"),
        ]:
            params = config.with_overrides(default_params, {key: {"r": 8, "target_modules": targets}})
            (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
            res = runner.invoke(app, ["validate", "params.yaml"])
            assert (res.exit_code, res.output.strip().splitlines()) == (2, [error]) if error else res.exit_code == 0, (
                res.output
            )

    model = config.ModelParams(source=str(tiny_model))

    def refused(targets: str | list[str]) -> str:
        with pytest.raises(InputError) as e:
            lora_targets(config.LoraParams(target_modules=targets), model, "sft.lora")
        return str(e.value)

    lora_targets(config.LoraParams(target_modules=r".*\.layers\.1\.self_attn\.(q|v)_proj"), model, "sft.lora")
    assert "'q_proj' matches no full module name of" in refused("q_proj")  # one string is peft's regex
    assert refused(["mlp"]).startswith("sft.lora.target_modules: 'mlp' matches model.layers.0.mlp, which LoRA cannot")


def test_a_params_yaml_leaving_stage_params_to_their_defaults_is_refused(tmp_path, monkeypatch):
    """recipes/code.yaml copied over params.yaml passed `rung validate`; `dvc repro eval_base` then ran curate
    (minutes) and stopped: "Parameters 'eval.bootstrap' are missing from 'params.yaml'". Refused first."""
    from flows.run import written
    from rung.checks import workspace

    monkeypatch.chdir(tmp_path)
    shutil.copy(ROOT / "dvc.yaml", tmp_path)
    shutil.copy(ROOT / "recipes" / "code.yaml", tmp_path / "params.yaml")
    res = CliRunner().invoke(app, ["validate", "params.yaml"])
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        "error: params.yaml: dvc.yaml's stages read environment, difficulty.buckets, reward_models, "
        "process_reward_models, eval.bootstrap, left to rung's defaults "
        "here, and DVC stops at a stage whose params are missing: run it as `rung run params.yaml` (every default "
        "written out), or write these keys out"
    ]
    # an RL stage's interpolated ${item.init} counts, and the fix named works: the defaults written out
    del (data := yaml.safe_load((tmp_path / "params.yaml").read_text()))["rl"]["stages"]["main"]["init"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(
        InputError,
        match=r"stages read environment, difficulty\.buckets, rl\.stages\.main\.init, reward_models, "
        r"process_reward_models, eval\.bootstrap, left",
    ):
        workspace.dvc_params(Path("params.yaml"))
    (tmp_path / "params.yaml").write_text(written(config.load("params.yaml")))
    workspace.dvc_params(Path("params.yaml"))
    workspace.dvc_params(ROOT / "recipes" / "code.yaml")  # a recipe where it lies: `rung run` writes it out
    workspace.dvc_params(ROOT / "params.yaml")
