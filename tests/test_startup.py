"""Start-up (issue #17): a stage imports only what it uses, so its preflight runs seconds after it
starts. Each check runs in a fresh interpreter and reads its sys.modules; bench/startup.py prints the times."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

MODEL = {
    "torch",
    "transformers",
    "trl",
    "peft",
    "accelerate",
}  # a model's libraries: imported where one is loaded or trained
DATA = {"reasoning_gym", "datasets", "datasketch"}  # reading sources (curate), verifying answers (rung.answers.verify)
# Per stage flow module, what its import may not load. Stages that generate or train import torch when
# they load the model (tasks.generation, rung.train.launch), after their preflight has run.
BANNED = {
    "model": MODEL | DATA,
    "curate": MODEL,
    "difficulty": MODEL,
    "traces": MODEL,
    "sft": MODEL | DATA,
    "rl": MODEL | DATA,
    "eval": MODEL,
    "report": MODEL | DATA,
}


def _loaded(code: str) -> set[str]:
    """The top-level packages in sys.modules after running `code` in a fresh interpreter in the repo."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(json.loads(out.splitlines()[-1]))


@pytest.mark.parametrize("stage", sorted(BANNED))
def test_a_stage_module_imports_only_what_the_stage_uses(stage):
    loaded = _loaded(f"import flows.{stage}")
    assert {"prefect", "mlflow", "rung"} <= loaded  # the probe saw the stage's imports
    assert not loaded & BANNED[stage], f"flows.{stage} imports {sorted(loaded & BANNED[stage])} at start-up"


def test_the_preflight_of_the_default_params_loads_no_model_library():
    """The full preflight runs at every stage start: it generates from the reasoning-gym sources, but loads no
    model library, nor what file and dataset sources (datasets) or deduplication (datasketch) need."""
    loaded = _loaded("from rung import config, paths, preflight\npreflight.check(config.load(paths.PARAMS))")
    assert "reasoning_gym" in loaded  # the sources were checked
    unused = loaded & (MODEL | {"datasets", "datasketch"})
    assert not unused, f"the preflight imports {sorted(unused)}"
