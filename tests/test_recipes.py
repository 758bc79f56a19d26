"""recipes/: every recipe validates as shipped, and runs end to end with `rung run` on the tiny
model with its sizes overridden (the recipe's format, template, presets and rewards kept)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows.run import written
from rung import config, preflight
from tests.conftest import ROOT
from tests.test_pipeline import prefect_server  # noqa: F401  # the module's Prefect server fixture

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
RUNG = [sys.executable, "-m", "flows.cli"]


def small(recipe: Path, model: Path) -> list[str]:
    """--set overrides that shrink a recipe to seconds on the tiny model: local reasoning-gym data
    instead of hub datasets, a few short steps; the format, rewards and algorithm stay the recipe's."""
    data = yaml.safe_load(recipe.read_text())
    sets = {
        "model.source": str(model), "model.dtype": "float32", "generation.backend": "transformers",
        "curate.sources": [{"name": "arith", "task": "basic_arithmetic", "size": 30,
                            "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}],
        "curate.max_test": 4,
        "difficulty.num_generations": 2, "difficulty.max_prompts": 4,
        "difficulty.sampling": {"temperature": 1.0, "max_new_tokens": 8, "batch_size": 8},
        "eval.sampling": {"temperature": 0.0, "max_new_tokens": 8, "batch_size": 8},
        "eval.samples": None,
        "eval.sets": [{"name": "chain", "task": "chain_sum", "size": 3}],
    }
    if data["sft"].get("enabled", True):
        sets |= {"sft.max_steps": 1, "sft.per_device_train_batch_size": 2}
        for i, trace in enumerate(data["sft"].get("traces", [])):
            if trace["type"] != "solutions":  # a teacher: the tiny model stands in for it
                sets |= {f"sft.traces.{i}.model": str(model), f"sft.traces.{i}.num_samples": 2, f"sft.traces.{i}.max_prompts": 4,
                         f"sft.traces.{i}.sampling": {"temperature": 1.0, "max_new_tokens": 8, "batch_size": 8}}
    for name, stage in data["rl"]["stages"].items():
        key = f"rl.stages.{name}"
        sets |= {f"{key}.max_steps": 2, f"{key}.save_steps": 2, f"{key}.num_generations": 2, f"{key}.prompts_per_step": 2,
                 f"{key}.max_completion_length": 8, f"{key}.use_vllm": False, f"{key}.trl": {}}
        if "overlong" in stage.get("rewards", {}):
            sets[f"{key}.rewards.overlong.args"] = {"buffer": 2}
    return [a for k, v in sets.items() for a in ("--set", f"{k}={json.dumps(v)}")]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates_as_shipped(recipe):
    params = config.load(recipe)
    preflight.check(params)
    assert config.parse(yaml.safe_load(written(params))) == params  # what `rung run` writes means the same
    assert recipe.read_text().startswith("# "), "a recipe starts with a comment giving its source"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_runs_small_end_to_end(recipe, tiny_model, prefect_server, tmp_path):  # noqa: F811
    ws = tmp_path / "run"
    env = {**os.environ, **prefect_server, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    res = subprocess.run([*RUNG, "run", str(recipe), "--dir", str(ws), *small(recipe, tiny_model)],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    shipped = config.load(recipe)
    ran = config.load(ws / "params.yaml")
    assert (ran.format, ran.rl.stages.keys()) == (shipped.format, shipped.rl.stages.keys())
    for name, stage in shipped.rl.stages.items():
        got = ran.rl.stages[name]
        assert (got.loss_type, got.epsilon_high, got.beta, got.init, got.learning_rate) == (
            stage.loss_type, stage.epsilon_high, stage.beta, stage.init, stage.learning_rate)
        assert json.loads((ws / f"data/metrics/rl-{name}.json").read_text())["steps"] == 2
    evaluated = json.loads((ws / f"data/metrics/eval-rl-{next(iter(shipped.rl.stages))}.json").read_text())
    assert evaluated["format"] == {"style": shipped.format.style, "template": shipped.format.template}
    assert "| rl/" in res.stdout and f"style {shipped.format.style}" in (ws / "data/reports/report.md").read_text()
    assert not (ROOT / "runs").exists() or ws.parent != ROOT / "runs"  # the project's workspace untouched


def test_run_refuses_bad_overrides_before_writing_anything(tmp_path):
    recipe = RECIPES[0]
    for sets, message in ((["--set", "seed"], "--set 'seed': expected KEY=VALUE"),
                          (["--set", "rl.stages.main.learning_rate=-1"], "rl.stages.main.learning_rate: Input should be greater than 0"),
                          (["--set", "format.style=latex"], "format.style: Input should be")):
        res = subprocess.run([*RUNG, "run", str(recipe), "--dir", str(tmp_path / "ws"), *sets], cwd=ROOT, capture_output=True, text=True, check=False)
        assert res.returncode == 2 and message in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not (tmp_path / "ws").exists()
