"""Code of the user's that params name by import path (an environment class, a reward function) is a DVC dep of
the stages that run it, and `rung run` carries it into its workspace or refuses in one line (rung.checks.usercode):
editing it makes those stages stale, in a real DVC repo."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from dvc.repo import Repo
from typer.testing import CliRunner

from flows.cli import app
from flows.run import copy_project, prepare, written
from rung import config
from rung.checks import usercode
from rung.errors import InputError
from tests.conftest import ROOT, forget

CALC = '''
class Calculator:
    def reset(self, **row) -> None:
        self.calls = 0

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return a + b
'''
BREVITY = "def brevity(completions, **kwargs):\n    return [0.0 for _ in completions]\n"
ENVIRONMENT_STAGES = {"difficulty", "rl@main", "eval_base", "eval_sft", "eval_rl@main"}


def _package(where: Path, name: str) -> None:
    (where / name).mkdir(parents=True)
    (where / name / "__init__.py").write_text("")
    (where / name / "calc.py").write_text(textwrap.dedent(CALC))
    (where / name / "rewards.py").write_text(BREVITY)


def _params(default_params: dict, package: str) -> dict:
    return config.with_overrides(
        default_params,
        {
            "model.chat_template": "tools",
            "environment": {"name": f"{package}.calc:Calculator", "max_turns": 2},
            "rl.stages.main.rewards": {"accuracy": 1.0, "mine": {"import": f"{package}.rewards:brevity"}},
        },
    )


@pytest.fixture
def project(tmp_path, monkeypatch, default_params):
    """A git project holding rung's code and `mypkg` (an environment class and a reward), run from its root, and a
    recipe of the experiment that uses both."""
    root = tmp_path / "project"
    root.mkdir()
    copy_project(ROOT, root)
    _package(root, "mypkg")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    monkeypatch.chdir(root)
    monkeypatch.syspath_prepend(str(root))
    forget("mypkg")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(_params(default_params, "mypkg"), sort_keys=False))
    yield root
    forget("mypkg")


def _deps(repo: Repo) -> dict[str, set[str]]:
    return {s.name: {d.def_path for d in s.deps} for s in repo.index.stages}


def test_rung_run_carries_user_code_and_editing_it_makes_its_stages_stale(project, tmp_path, monkeypatch):
    ws = prepare(tmp_path / "recipe.yaml", {}, tmp_path / "ws", project)
    monkeypatch.chdir(ws)  # DVC's API reads paths from the working directory
    assert (ws / "mypkg" / "calc.py").read_text() == (project / "mypkg" / "calc.py").read_text()
    repo = Repo(str(ws))
    deps = _deps(repo)
    assert {s for s, d in deps.items() if "mypkg/calc.py" in d} == ENVIRONMENT_STAGES
    assert {s for s, d in deps.items() if "mypkg/rewards.py" in d} == {"rl@main"}
    kept = [line for line in (ws / "dvc.yaml").read_text().splitlines() if "mypkg/" not in line]
    assert kept == (project / "dvc.yaml").read_text().splitlines()  # only lines added: comments and layout kept

    # the difficulty stage as if it had run: its data deps and outputs in place, recorded in dvc.lock
    for path in ("data/models/sft/config.json", "data/curated/train.jsonl", "data/difficulty/scores.jsonl"):
        (ws / path).parent.mkdir(parents=True, exist_ok=True)
        (ws / path).write_text("{}\n")
    for path in ("data/difficulty/train.jsonl", "data/metrics/difficulty.json", "data/plots/difficulty/pass_rate.json"):
        (ws / path).parent.mkdir(parents=True, exist_ok=True)
        (ws / path).write_text("{}\n")
    repo.commit("difficulty", force=True)
    assert repo.status(targets=["difficulty"]) == {}
    (ws / "mypkg" / "rewards.py").write_text(BREVITY.replace("0.0", "1.0"))  # RL's only: difficulty stays
    assert repo.status(targets=["difficulty"]) == {}
    (ws / "mypkg" / "calc.py").write_text(textwrap.dedent(CALC).replace("a + b", "a + b + 1"))
    assert repo.status(targets=["difficulty"]) == {"difficulty": [{"changed deps": {"mypkg/calc.py": "modified"}}]}


def test_rung_run_refuses_user_code_outside_the_project_before_writing_anything(
    project, tmp_path, monkeypatch, default_params
):
    elsewhere = tmp_path / "elsewhere"
    _package(elsewhere, "farpkg")
    monkeypatch.syspath_prepend(str(elsewhere))
    recipe = tmp_path / "far.yaml"
    recipe.write_text(yaml.safe_dump(_params(default_params, "farpkg"), sort_keys=False))
    with pytest.raises(InputError) as e:
        prepare(recipe, {}, tmp_path / "ws", project)
    assert str(e.value).startswith(
        f"environment.name: farpkg.calc:Calculator is {elsewhere / 'farpkg' / 'calc.py'}, outside the project"
    )
    assert "\n" not in str(e.value) and not (tmp_path / "ws").exists()


def test_validate_refuses_a_dvc_yaml_without_the_user_code_in_its_deps(project, tmp_path):
    params = config.load(tmp_path / "recipe.yaml")
    (project / "params.yaml").write_text(written(params))
    res = CliRunner().invoke(app, ["validate", "params.yaml"])
    assert res.exit_code == 2 and res.output.strip().splitlines() == [
        "error: environment.name: mypkg/calc.py is code that dvc.yaml's stages difficulty, rl, eval_base, eval_sft, "
        "eval_rl run, and not in their deps (DVC would not rerun them when it changes); add it to their deps, or run "
        "with `rung run`"
    ]
    usercode.add(project / "dvc.yaml", usercode.deps(params, project))  # the fix named
    res = CliRunner().invoke(app, ["validate", "params.yaml"])
    assert res.exit_code == 0, res.output
    shutil.rmtree(project / "mypkg")  # nothing left to find: refused as not loading, naming the key
    for name in [m for m in sys.modules if m == "mypkg" or m.startswith("mypkg.")]:
        del sys.modules[name]
    res = CliRunner().invoke(app, ["validate", "params.yaml"])
    assert res.exit_code == 2 and res.output.startswith("error: environment.name: cannot load"), res.output
